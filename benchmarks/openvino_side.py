"""A deployment peer: timm's ViT exported to ONNX (`benchmarks.onnx_export`), run by OpenVINO on the CPU.

Runs in the peer environment, driven by `benchmarks.worker` like the other
sides. The model is compiled as OpenVINO's latency guide has it: the batch
fixed at compile time, the LATENCY hint, the suite's threads. Precision is
pinned to f32: on a CPU with AVX-512 BF16 OpenVINO would otherwise run bf16,
and every other row of the suite computes in float32. Inference only.
"""

import numpy as np
import openvino

from benchmarks import onnx_export

_CORE = openvino.Core()
_THREADS = {}


def versions():
    return {"openvino": openvino.__version__, "device": "cpu"}


def set_threads(threads):
    _THREADS["threads"] = threads


def _compile(model):
    return _CORE.compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": _THREADS["threads"],
                                              "PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"})


def matmul(m, k, n, dtype="float32"):
    if dtype != "float32":
        raise ValueError(f"the OpenVINO side times float32 only; received dtype={dtype!r}")
    request = _compile(_CORE.read_model(onnx_export.matmul_model(m, k, n), b"")).create_infer_request()
    scale = np.ones(1, np.float32)
    return lambda: request.infer({0: scale})


def inference(variant, batch, image_size, compiled=False, precision="float32", num_layers=None):
    if precision != "float32":
        raise ValueError(f"the OpenVINO side runs float32 only; received precision={precision!r}")
    return run_file(onnx_export.onnx_path(variant, image_size, num_layers), (batch, 3, image_size, image_size))


def run_file(path, shape):
    """A call of the model file at `path` (ONNX, OpenVINO IR), compiled for input `shape` as this side compiles."""
    model = _CORE.read_model(path)
    model.reshape({model.inputs[0].get_any_name(): list(shape)})
    request = _compile(model).create_infer_request()
    images = np.random.default_rng(0).uniform(-1, 1, shape).astype(np.float32)
    return lambda: request.infer({0: images})
