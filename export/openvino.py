"""OpenVINO IR export: the model for OpenVINO's runtime, checked by that runtime before it is written.

`python -m export --format=openvino --output=DIR` writes `DIR/model.xml` and
`model.bin` (OpenVINO's IR), `labels.txt` when labels are given, and
`metadata.json`. The IR takes the model's own input, float32
`(batch, height, width, channels)` scaled by `keras_vit.preprocess_input`
(named `inputs`; any batch), and returns float32 `scores` (probabilities or
logits, as `metadata.json` says): the same contract as the TFLite export.

A class-token head is converted trimmed (`keras_vit.trim_last_block`): the
same scores for about a twelfth less work. Before the directory appears, a
fresh Python process that imports only OpenVINO and numpy (as a deployment
does) compiles the staged IR for the CPU in float32, and its scores on the
given real images are compared with Keras' to the float TFLite export's
tolerance (1e-4 in probabilities, every top-1 the same). The IR
comes from TensorFlow's graph of the model (`openvino.convert_model`), so
this export runs on Keras' TensorFlow backend. (Inside, `openvino` is
OpenVINO's own package: imports are absolute.)
"""

import os

import openvino
import tensorflow as tf

from export import common
from keras_vit.trim import trim_last_block

FILE = "model.xml"  # and its weights, model.bin; beside common.LABELS_FILE and METADATA_FILE
# OpenVINO would run bf16 on a CPU that has it (its default precision hint there): the check and the
# metadata state float32, and a user's compile_model should ask for it too (docs/serving.md).
COMPILE_CONFIG = {"INFERENCE_PRECISION_HINT": "f32"}


def convert(model):
    """`model` (trimmed where it can be) as an `openvino.Model` with input `inputs`, output `scores`."""
    served = trim_last_block(model)
    signature = tf.TensorSpec((None, *common.input_shape(model)[1:]), tf.float32, name="inputs")
    forward = tf.function(lambda inputs: served(inputs, training=False), input_signature=[signature],
                          autograph=False)
    # A copy of the weights: shared (the default), they are TensorFlow's buffers of the traced graph, freed once this
    # function returns, and the IR saved later held whatever took their place (NaN scores from a 224 px Ti/16).
    converted = openvino.convert_model(forward.get_concrete_function(), share_weights=False)
    converted.outputs[0].get_tensor().set_names({"scores"})
    return converted


# What a deployment runs: OpenVINO and numpy, no TensorFlow (checked in the process itself), in float32.
CLIENT = f"""
import sys
import numpy as np
import openvino
compiled = openvino.Core().compile_model(sys.argv[1], "CPU", {COMPILE_CONFIG!r})
images = np.load(sys.argv[2])
scores = [compiled(images[i:i + 32])["scores"] for i in range(0, len(images), 32)]
assert not any(m.split(".")[0] in ("tensorflow", "keras", "keras_vit") for m in sys.modules), "not a bare client"
np.save(sys.argv[3], np.concatenate(scores))
"""


def _save(converted, folder):
    openvino.save_model(converted, os.path.join(folder, FILE), compress_to_fp16=False)
    return os.path.join(folder, FILE)


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
        common.ToleranceError: the IR is not within `common.FLOAT_TOLERANCE` of Keras;
            nothing was written.
        ValueError: an argument is not what the export takes.
    """
    ours = {"format": "openvino", "openvino": openvino.__version__}
    result = common.write_checked(model, output_dir, verify_images, labels, metadata, ours=ours, kind="OpenVINO",
                                  convert=convert, save=_save, client=CLIENT, runtime="OpenVINO")
    path = result.pop("path")
    return {**result, "xml_path": path}


def from_command_line(model, request):
    """`python -m export --format=openvino`: writes the IR and prints its check."""
    result = export_openvino(model, request.output, request.images, labels=request.labels, metadata=request.metadata)
    print(common.check_line(result, f"OpenVINO IR written to {result['xml_path']}",
                            "OpenVINO's CPU runtime, in a fresh process"))
