"""OpenVINO IR export: the model for OpenVINO's runtime, checked by that runtime before it is written.

`python -m export --format=openvino --output=DIR` writes `DIR/model.xml` and
`model.bin` (OpenVINO's IR), `labels.txt` when labels are given, and
`metadata.json`. The IR takes the model's own input, float32
`(batch, height, width, channels)` scaled by `keras_vit.preprocess_input`
(named `inputs`; any batch), and returns float32 `scores` (probabilities or
logits, as `metadata.json` says): the same contract as the TFLite export.

A class-token head is converted trimmed (`keras_vit.trim_last_block`): the
same scores for about a twelfth less work. Before the directory appears,
OpenVINO's runtime compiles the IR for the CPU in float32 and its scores on
the given real images are compared with Keras' to the float TFLite
export's tolerance (1e-4 in probabilities, every top-1 the same). The IR
comes from TensorFlow's graph of the model (`openvino.convert_model`), so
this export runs on Keras' TensorFlow backend. (Inside, `openvino` is
OpenVINO's own package: imports are absolute.)
"""

import os

import numpy as np
import openvino
import tensorflow as tf

from export import common
from keras_vit.atomic_files import new_directory
from keras_vit.trim import trim_last_block

FILE = "model.xml"  # and its weights, model.bin; beside common.LABELS_FILE and METADATA_FILE
TOLERANCE = common.FLOAT_TOLERANCE
# OpenVINO would run bf16 on a CPU that has it (its default precision hint there): the check and the
# metadata state float32, and a user's compile_model should ask for it too (docs/serving.md).
COMPILE_CONFIG = {"INFERENCE_PRECISION_HINT": "f32"}


def convert(model):
    """`model` (trimmed where it can be) as an `openvino.Model` with input `inputs`, output `scores`."""
    served = trim_last_block(model)
    signature = tf.TensorSpec((None, *common.input_shape(model)[1:]), tf.float32, name="inputs")
    forward = tf.function(lambda inputs: served(inputs, training=False), input_signature=[signature],
                          autograph=False)
    converted = openvino.convert_model(forward.get_concrete_function())
    converted.outputs[0].get_tensor().set_names({"scores"})
    return converted


def run(converted, images):
    """Scores of `converted` on float32 `images`, from OpenVINO's CPU runtime in float32."""
    compiled = openvino.Core().compile_model(converted, "CPU", COMPILE_CONFIG)
    return np.concatenate([compiled(images[i:i + 32])["scores"] for i in range(0, len(images), 32)])


def verify(converted, model, images):
    """`max_abs_diff_probabilities`, `top1_agreement` and `num_images` of `converted` against Keras."""
    return {**common.compare(model, common.keras_scores(model, images), run(converted, images)),
            "num_images": len(images)}


def export_openvino(model, output_dir, verify_images, labels=None, metadata=None):
    """Converts `model`, checks it in OpenVINO's runtime against Keras, and writes the `FILES`.

    Args:
        model: a keras_vit classifier with a fixed-size image input.
        output_dir: str or path. Must not exist; written under a temporary
            name beside it, renamed last.
        verify_images: float32 `(n, height, width, channels)` real images,
            scaled as the model takes them.
        labels: optional class names, one per output, written to `labels.txt`.
        metadata: optional JSON-serialisable dict merged into `metadata.json`.

    Returns:
        dict: the check's numbers, `output_dir` and `xml_path`.

    Raises:
        common.ToleranceError: the IR is not within `TOLERANCE` of Keras; nothing was written.
        ValueError: an argument is not what the export takes.
    """
    output_dir, verify_images, labels = common.check_export_arguments(model, output_dir, verify_images, labels,
                                                                      "OpenVINO")
    ours = {"format": "openvino", "tolerance": dict(TOLERANCE), "openvino": openvino.__version__,
            **common.input_and_output(model, batch=None)}
    common.check_metadata(metadata, {**ours, "check": None})

    converted = convert(model)
    result = verify(converted, model, verify_images)
    common.refuse_unless_within(TOLERANCE, result, "OpenVINO")
    with new_directory(output_dir) as staging:
        openvino.save_model(converted, os.path.join(staging, FILE), compress_to_fp16=False)
        common.write_labels_and_metadata(staging, labels, common.check_metadata(metadata, {**ours, "check": result}))
    return {**result, "output_dir": output_dir, "xml_path": os.path.join(output_dir, FILE)}


def from_command_line(model, request):
    """`python -m export --format=openvino`: writes the IR and prints its check."""
    result = export_openvino(model, request.output, request.images, labels=request.labels, metadata=request.metadata)
    print(f"OpenVINO IR written to {result['xml_path']}: on {result['num_images']} images, top-1 agreement "
          f"{result['top1_agreement']:.2%}, max |difference| of probabilities "
          f"{result['max_abs_diff_probabilities']:.2e} (OpenVINO's CPU runtime against Keras)")
