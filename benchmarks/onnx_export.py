"""timm's ViT as an ONNX file, the form ONNX Runtime and OpenVINO deploy: exported once, then reused.

Runs in the peer environment (`requirements-peers.txt`), where timm and the
runtimes live. `torch.onnx.export`'s default exporter (torch.export, then
onnxscript's graph optimisation) writes the model with a dynamic batch
dimension, as a deployment keeps it; a runtime may fix the batch when it
compiles (OpenVINO does). Files live under benchmarks/.envs/onnx (gitignored),
written under a temporary name and renamed when whole.
"""

import os
import pathlib

ONNX_DIR = pathlib.Path(__file__).resolve().parent / ".envs" / "onnx"
INPUT_NAME = "images"  # [batch, 3, height, width] float32, NCHW as timm takes it


def onnx_path(variant, image_size, num_layers=None):
    """The ONNX file of timm's `variant` at `image_size` (and `num_layers`, if set), exported on first use."""
    from benchmarks.timm_side import TIMM_NAMES, import_timm

    depth = f"_depth{num_layers}" if num_layers else ""
    path = ONNX_DIR / f"{TIMM_NAMES[variant]}_{image_size}px{depth}.onnx"
    if path.exists():
        return path
    import torch

    timm = import_timm()
    model = timm.create_model(TIMM_NAMES[variant], img_size=image_size,
                              **({"depth": num_layers} if num_layers else {})).eval()
    images = torch.randn(2, 3, image_size, image_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.onnx.export(model, (images,), staging, input_names=[INPUT_NAME], output_names=["logits"],
                      dynamic_shapes={"x": {0: torch.export.Dim("batch", min=1, max=4096)}}, dynamo=True,
                      optimize=True, external_data=False, verbose=False)
    _check_export(staging, model, images)
    os.replace(staging, path)
    return path


def _check_export(path, model, images):
    """Refuses an export whose logits differ from timm's own: a peer must compute the same model."""
    import numpy as np
    import onnxruntime
    import torch

    with torch.inference_mode():
        expected = model(images).numpy()
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (received,) = session.run(None, {INPUT_NAME: images.numpy()})
    error = float(np.abs(received - expected).max())
    if not error < 1e-3:
        os.remove(path)
        raise RuntimeError(f"timm's ONNX export differs from timm by {error:.2e} (expected < 1e-3): not a fair peer")


def matmul_model(m, k, n):
    """A one-node ONNX MatMul of constant [m, k] and [k, n] float32 operands: a runtime's own GEMM rate."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    a, b = (numpy_helper.from_array(rng.standard_normal(shape, dtype=np.float32), name)
            for name, shape in (("a", (m, k)), ("b", (k, n))))
    # A scalar input: a runtime runs the node on every call rather than folding a constant product away.
    scale = helper.make_tensor_value_info("scale", onnx.TensorProto.FLOAT, [1])
    product = helper.make_tensor_value_info("product", onnx.TensorProto.FLOAT, [m, n])
    graph = helper.make_graph([helper.make_node("Mul", ["a", "scale"], ["scaled"]),
                               helper.make_node("MatMul", ["scaled", "b"], ["product"])],
                              "matmul", [scale], [product], initializer=[a, b])
    # IR version 10 (ONNX 1.16): the newest onnx package writes a newer one than the runtimes read.
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    return model.SerializeToString()
