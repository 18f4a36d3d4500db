"""keras_vit as an ONNX Runtime deployment runs it, driven by `benchmarks.worker`: `python -m export`'s ONNX file.

A child process (`benchmarks.served_export`) builds the model and writes
`python -m export --format=onnx`'s file (converted trimmed, and checked by
ONNX Runtime against Keras); this process loads it with ONNX Runtime alone,
in the session the ONNX Runtime row runs timm's file in
(`benchmarks.onnxruntime_side`: CPU provider, every graph optimisation, the
suite's threads). Inference only.
"""

import numpy as np

from benchmarks import onnxruntime_side, served_export

versions = onnxruntime_side.versions
set_threads = onnxruntime_side.set_threads


def inference(variant, batch, image_size, compiled=False, precision="float32", num_layers=None, scan_layers=False):
    if precision != "float32":
        raise ValueError(f"the ONNX Runtime side runs float32 only; received precision={precision!r}")
    path = served_export.write("onnx", variant=variant, image_size=image_size, precision=precision,
                               num_layers=num_layers, scan_layers=scan_layers, jit_compile=False)
    session = onnxruntime_side.make_session(path)
    images = np.random.default_rng(0).uniform(-1, 1, (batch, image_size, image_size, 3)).astype(np.float32)
    return lambda: session.run(None, {"inputs": images})
