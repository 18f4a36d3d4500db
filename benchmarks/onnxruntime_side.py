"""A deployment peer: timm's ViT exported to ONNX (`benchmarks.onnx_export`), run by ONNX Runtime on the CPU.

Runs in the peer environment, driven by `benchmarks.worker` like the other
sides. The session is what ONNX Runtime's users start with: the CPU execution
provider and every graph optimisation (its default), on the suite's threads.
Inference only: ONNX Runtime does not train the model.
"""

import numpy as np
import onnxruntime

from benchmarks import onnx_export

_THREADS = {}


def versions():
    return {"onnxruntime": onnxruntime.__version__, "device": "cpu"}


def set_threads(threads):
    _THREADS["intra_op"] = threads


def make_session(model):
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = _THREADS["intra_op"]
    options.inter_op_num_threads = 1
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    return onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def matmul(m, k, n, dtype="float32"):
    if dtype != "float32":
        raise ValueError(f"the ONNX Runtime side times float32 only; received dtype={dtype!r}")
    session = make_session(onnx_export.matmul_model(m, k, n))
    scale = np.ones(1, np.float32)
    return lambda: session.run(None, {"scale": scale})


def inference(variant, batch, image_size, compiled=False, precision="float32", num_layers=None):
    if precision != "float32":
        raise ValueError(f"the ONNX Runtime side runs float32 only; received precision={precision!r}")
    session = make_session(str(onnx_export.onnx_path(variant, image_size, num_layers)))
    images = np.random.default_rng(0).standard_normal((batch, 3, image_size, image_size), dtype=np.float32)
    return lambda: session.run(None, {onnx_export.INPUT_NAME: images})
