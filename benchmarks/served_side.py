"""keras_vit as TF Serving runs it, driven by `benchmarks.worker`: the export, loaded by TensorFlow's C API.

A child process (`benchmarks.served_export`) builds the model and writes
`python -m export`'s SavedModel; this process then loads it through the
C API (`export.capi`, TF Serving's `LoadSavedModel` and `Session::Run`) without
TensorFlow's Python runtime, as the C++ server does, and answers the
float-input signature (`predict_float`): the call times the model, not image
decoding. `compiled` writes the export with `jit_compile=True` (TF Serving's
`--xla_cpu_compilation_enabled`). Inference only.
"""

import importlib.metadata

from benchmarks import served_export
from export import capi

capi.without_tensorflow_runtime()  # before numpy, as a C++ server: TensorFlow's code here is the C API's

import numpy as np  # noqa: E402

_THREADS = {}


def versions():
    return {"tensorflow": importlib.metadata.version("tensorflow"), "device": "cpu"}


def set_threads(threads):
    _THREADS["threads"] = threads


def inference(variant, batch, image_size, compiled=False, precision="float32", num_layers=None, scan_layers=False):
    path = served_export.write("saved_model", variant=variant, image_size=image_size, precision=precision,
                               num_layers=num_layers, scan_layers=scan_layers, jit_compile=compiled)
    session = capi.SavedModelSession(path, threads=_THREADS["threads"])
    images = np.random.default_rng(0).uniform(-1, 1, (batch, image_size, image_size, 3)).astype(np.float32)
    return lambda: session.run("predict_float", inputs=images)
