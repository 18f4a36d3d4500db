"""keras_vit as an OpenVINO deployment runs it, driven by `benchmarks.worker`: `python -m export`'s IR.

A child process (`benchmarks.served_export`) builds the model and writes
`python -m export --format=openvino`'s IR (converted trimmed, and checked
by OpenVINO's runtime against Keras); this process loads it with
OpenVINO alone and compiles it as the OpenVINO row compiles timm's ONNX
(`benchmarks.openvino_side`: batch fixed, LATENCY hint, float32, the suite's
threads). Inference only.
"""

from benchmarks import openvino_side, served_export

versions = openvino_side.versions
set_threads = openvino_side.set_threads


def inference(variant, batch, image_size, compiled=False, precision="float32", num_layers=None, scan_layers=False):
    if precision != "float32":
        raise ValueError(f"the OpenVINO side runs float32 only; received precision={precision!r}")
    path = served_export.write("openvino", variant=variant, image_size=image_size, precision=precision,
                               num_layers=num_layers, scan_layers=scan_layers, jit_compile=False)
    return openvino_side.run_file(path, (batch, image_size, image_size, 3))
