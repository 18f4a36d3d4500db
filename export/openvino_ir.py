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
this export runs on Keras' TensorFlow backend.
"""

import os

import numpy as np
import openvino
import tensorflow as tf

from export import tflite
from keras_vit.atomic_files import new_directory
from keras_vit.trim import trim_last_block

FILES = ("model.xml", "model.bin", "labels.txt", "metadata.json")
TOLERANCE = tflite.TOLERANCES["none"]
# OpenVINO would run bf16 on a CPU that has it (its default precision hint there): the check and the
# metadata state float32, and a user's compile_model should ask for it too (docs/serving.md).
COMPILE_CONFIG = {"INFERENCE_PRECISION_HINT": "f32"}


def convert(model):
    """`model` (trimmed where it can be) as an `openvino.Model` with input `inputs`, output `scores`."""
    served = trim_last_block(model)
    signature = tf.TensorSpec((None, *tflite.input_shape(model)[1:]), tf.float32, name="inputs")
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
    expected = np.asarray(model.predict(images, batch_size=32, verbose=0), np.float32)
    return {**tflite.compare(model, expected, run(converted, images)), "num_images": len(images)}


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
        tflite.ToleranceError: the IR is not within `TOLERANCE` of Keras; nothing was written.
        ValueError: an argument is not what the export takes.
    """
    output_dir, verify_images, labels = tflite.check_export_arguments(model, output_dir, verify_images, labels,
                                                                      kind="OpenVINO")
    ours = {"format": "openvino", "tolerance": dict(TOLERANCE), "openvino": openvino.__version__,
            **tflite.input_and_output(model)}
    ours["input"]["shape"][0] = None  # any batch
    clashes = sorted(set(metadata or {}) & {*ours, "check"})
    if clashes:
        raise ValueError(f"`metadata` must not set the keys the export writes; received keys {clashes}")

    converted = convert(model)
    result = verify(converted, model, verify_images)
    failures = tflite.check_tolerance("none", result)
    if failures:
        raise tflite.ToleranceError(f"The OpenVINO model is not within {TOLERANCE} of the Keras model on "
                                    f"{len(verify_images)} images: {'; '.join(failures)}. Nothing was written")
    xml, _, labels_name, metadata_name = FILES
    with new_directory(output_dir) as staging:
        openvino.save_model(converted, os.path.join(staging, xml), compress_to_fp16=False)
        tflite.write_labels_and_metadata(staging, labels_name, labels, metadata_name,
                                         {**(metadata or {}), **ours, "check": result})
    return {**result, "output_dir": output_dir, "xml_path": os.path.join(output_dir, xml)}
