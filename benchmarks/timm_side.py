"""The peer: timm's VisionTransformer on PyTorch, run by `benchmarks.worker`.

Runs only in the benchmark's own peer environment (`requirements-peers.txt`),
never beside keras_vit. The functions mirror `benchmarks.keras_side`: each
builds one workload and returns a callable that runs it once, synchronously.
"""

import sys

import torch

# keras_vit variant -> timm model of the same architecture (token pooling,
# qkv bias, 1000 classes). timm's GELU is exact where the official one is the
# tanh approximation: the matmul FLOPs are the same.
TIMM_NAMES = {
    "Ti/16": "vit_tiny_patch16_224",
    "S/16": "vit_small_patch16_224",
    "B/16": "vit_base_patch16_224",
    "L/16": "vit_large_patch16_224",
}


def import_timm():
    """Imports timm; works around a torchvision wheel whose C++ ops cannot load.

    timm imports torchvision at import time. The PyPI Linux torchvision wheel is
    a CUDA build; beside the CPU torch wheel its extension does not load and
    ``import torchvision`` raises "operator torchvision::nms does not exist"
    (from its meta registrations). ViT uses no torchvision op, so in that case
    the two op schemas torchvision looks for are declared (no kernels) and the
    import is retried. Nothing is changed when torchvision imports cleanly.
    """
    try:
        import torchvision  # noqa: F401
    except RuntimeError as exc:
        if "torchvision::" not in str(exc):
            raise
        for name in list(sys.modules):
            if name == "torchvision" or name.startswith("torchvision."):
                del sys.modules[name]
        torch.library.define("torchvision::nms", "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        torch.library.define("torchvision::qnms", "(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor")
        import torchvision  # noqa: F401
    import timm
    return timm


def versions():
    timm = import_timm()
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return {"torch": torch.__version__, "timm": timm.__version__, "device": device}


def set_threads(threads):
    torch.set_num_threads(threads)


def _device():
    return "cuda" if torch.cuda.is_available() else "cpu"


def _synchronize():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def matmul(m, k, n, dtype="float32"):
    a = torch.randn(m, k, device=_device(), dtype=getattr(torch, dtype))
    b = torch.randn(k, n, device=_device(), dtype=getattr(torch, dtype))

    def call():
        torch.mm(a, b)
        _synchronize()
    return call


def _model(variant, image_size, compiled, num_layers):
    timm = import_timm()
    depth = {"depth": num_layers} if num_layers else {}
    model = timm.create_model(TIMM_NAMES[variant], img_size=image_size, **depth).to(_device())
    # torch.compile is the peer's XLA; on the CPU it would time C++ builds, so
    # the CPU suite runs timm eager, as its users do.
    if not compiled:
        return model, model
    # Each workload is compiled afresh, as a user's one model is: Dynamo would otherwise recompile the
    # earlier workloads' code for a new batch as dynamic shapes, and stop compiling after its recompile limit.
    torch._dynamo.reset()
    return model, torch.compile(model)


def _autocast(precision):
    enabled = precision == "mixed_bfloat16"
    return torch.autocast(_device(), dtype=torch.bfloat16, enabled=enabled)


def inference(variant, batch, image_size, compiled=False, precision="float32", num_layers=None):
    module, model = _model(variant, image_size, compiled, num_layers)
    module.eval()
    images = torch.randn(batch, 3, image_size, image_size, device=_device())

    def call():
        with torch.inference_mode(), _autocast(precision):
            model(images)
        _synchronize()
    return call


def training(variant, batch, image_size, compiled=False, precision="float32", num_layers=None):
    module, model = _model(variant, image_size, compiled, num_layers)
    module.train()
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-4)
    images = torch.randn(batch, 3, image_size, image_size, device=_device())
    labels = torch.arange(batch, device=_device()) % 1000

    def call():
        optimizer.zero_grad(set_to_none=True)
        with _autocast(precision):
            loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        _synchronize()
    return call
