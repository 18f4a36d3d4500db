"""ONNX export: the model for ONNX Runtime (and TensorRT, OpenVINO, CoreML's converters), checked before it is written.

`python -m export --format=onnx --output=DIR` writes `DIR/model.onnx`,
`labels.txt` when labels are given, and `metadata.json`. The model takes the
contract of the OpenVINO IR: float32 `(batch, height, width, channels)`
scaled by `keras_vit.preprocess_input` (input `inputs`, any batch), and
returns float32 `scores` (probabilities or logits, as `metadata.json` says).
A class-token head is converted trimmed (`keras_vit.trim_last_block`).

The file comes from TensorFlow's graph of the model through tf2onnx (what
Keras' own `model.export(format="onnx")` calls on this backend, which names
the output `Identity:0`), at opset `OPSET` (BUILD.md says why). Before the
directory appears, a fresh Python process that imports only ONNX Runtime and
numpy (as a deployment does) loads the staged file on ONNX Runtime's CPU
provider with its default graph optimisations and scores the given real
images; they must match Keras at the float tolerance (1e-4 in
probabilities, every top-1 the same).
"""

import os

import tensorflow as tf

from export import common
from keras_vit.trim import trim_last_block

FILE = "model.onnx"  # beside common.LABELS_FILE and METADATA_FILE
# ONNX 1.12's opset (2022): LayerNormalization is an op; ONNX Runtime, TensorRT 8.6+ and OpenVINO read it.
OPSET = 17

# What a deployment runs: ONNX Runtime and numpy, no TensorFlow (checked in the process itself).
CLIENT = """
import sys
import numpy as np
import onnxruntime
session = onnxruntime.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
images = np.load(sys.argv[2])
scores = [session.run(["scores"], {"inputs": images[i:i + 32]})[0] for i in range(0, len(images), 32)]
assert not any(m.split(".")[0] in ("tensorflow", "keras", "keras_vit") for m in sys.modules), "not a bare client"
np.save(sys.argv[3], np.concatenate(scores))
"""


def convert(model, opset=OPSET):
    """`model` (trimmed where it can be) as a serialized ONNX model with input `inputs` and output `scores`."""
    import tf2onnx  # the export extra's; it imports TensorFlow, as this module does

    served = trim_last_block(model)
    signature = tf.TensorSpec((None, *common.input_shape(model)[1:]), tf.float32, name="inputs")
    forward = tf.function(lambda inputs: {"scores": served(inputs, training=False)}, input_signature=[signature],
                          autograph=False)
    proto, _ = tf2onnx.convert.from_function(forward, input_signature=[signature], opset=opset)
    return proto.SerializeToString()


def _save(onnx_bytes, folder):
    with open(os.path.join(folder, FILE), "wb") as f:
        f.write(onnx_bytes)
    return os.path.join(folder, FILE)


def export_onnx(model, output_dir, verify_images, labels=None, metadata=None):
    """Converts `model`, checks the file in ONNX Runtime against Keras, and writes it with labels and metadata.

    Args:
        model: a keras_vit classifier with a fixed-size image input.
        output_dir: str or path. Must not exist; written under a temporary
            name beside it, renamed last.
        verify_images: float32 `(n, height, width, channels)` real images,
            scaled as the model takes them.
        labels: optional class names, one per output, written to `labels.txt`.
        metadata: optional JSON-serialisable dict merged into `metadata.json`.

    Returns:
        dict: the check's numbers, `output_dir` and `onnx_path`.

    Raises:
        common.ToleranceError: the file is not within `common.FLOAT_TOLERANCE` of Keras;
            nothing was written.
        ValueError: an argument is not what the export takes.
    """
    import onnxruntime
    import tf2onnx

    ours = {"format": "onnx", "opset": OPSET, "tf2onnx": tf2onnx.__version__, "onnxruntime": onnxruntime.__version__}
    result = common.write_checked(model, output_dir, verify_images, labels, metadata, ours=ours, kind="ONNX",
                                  convert=convert, save=_save, client=CLIENT, runtime="ONNX Runtime")
    path = result.pop("path")
    return {**result, "onnx_path": path}


def from_command_line(model, request):
    """`python -m export --format=onnx`: writes the file and prints its check."""
    result = export_onnx(model, request.output, request.images, labels=request.labels, metadata=request.metadata)
    print(common.check_line(result, f"ONNX model written to {result['onnx_path']}",
                            "ONNX Runtime's CPU provider, in a fresh process"))
