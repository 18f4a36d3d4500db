"""Plain numpy forward passes with the official ViT numerics.

Written from the paper and google-research/vision_transformer
(`models_vit.py`): LayerNorm eps 1e-6, tanh GELU, query scaled by
1/sqrt(head_dim), pre-norm residual blocks. Used to check the layers value by
value; the golden fixtures from timm check the whole model independently.
"""

import numpy as np


def layer_norm(x, scale, bias, eps=1e-6):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * scale + bias


def rms_norm(x, scale, eps=1e-6):
    """timm's RmsNorm: no mean taken, no bias."""
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * scale


def norm(x, w, name, eps=1e-6):
    """`w`'s LayerNorm `name` (`name/gamma`, `name/beta`) or RMSNorm (`name/scale`), as its weights say."""
    if f"{name}/scale" in w:
        return rms_norm(x, w[f"{name}/scale"], eps)
    return layer_norm(x, w[f"{name}/gamma"], w[f"{name}/beta"], eps)


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def gelu_exact(x):
    from scipy.special import erf

    return 0.5 * x * (1 + erf(x / np.sqrt(2)))


def quick_gelu(x):
    """CLIP's QuickGELU (open_clip's `QuickGELU`, timm's `quick_gelu`)."""
    return x / (1 + np.exp(-1.702 * x))


def silu(x):
    return x / (1 + np.exp(-x))


ACTIVATIONS = {"gelu_tanh": gelu_tanh, "gelu": gelu_exact, "quick_gelu": quick_gelu, "silu": silu}


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def attention(x, w, relative_logits=None, eps=1e-6):
    """`w`: dict of query/key/value/output kernels and biases (official shapes); a missing bias is zero; with
    `query_norm/...` and `key_norm/...` weights, queries and keys are normalised per head before the scaling."""
    q = np.einsum("btd,dhk->bthk", x, w["query_kernel"]) + w.get("query_bias", 0.0)
    k = np.einsum("btd,dhk->bthk", x, w["key_kernel"]) + w.get("key_bias", 0.0)
    v = np.einsum("btd,dhk->bthk", x, w["value_kernel"]) + w.get("value_bias", 0.0)
    if any(key.startswith("query_norm/") for key in w):
        q, k = norm(q, w, "query_norm", eps), norm(k, w, "key_norm", eps)
    q = q / np.sqrt(q.shape[-1])
    logits = np.einsum("bqhk,bthk->bhqt", q, k)
    if relative_logits is not None:
        logits = logits + relative_logits(q)
    weights = softmax(logits)
    out = np.einsum("bhqt,bthk->bqhk", weights, v)
    return np.einsum("bqhk,hkd->bqd", out, w["output_kernel"]) + w["output_bias"], weights


def encoder_block(x, w, relative_logits=None, activation="gelu_tanh", gated=False, eps=1e-6):
    """`w`: attention weights plus norm_1/norm_2 (LayerNorm gamma/beta or RMSNorm scale) and mlp dense_1/2; with
    layer_scale_1/2 gamma, each branch is multiplied by its gamma (timm's `ls1` / `ls2`); `gated`: dense_1 gives
    the gate, then the value (SwiGLU)."""
    y, _ = attention(norm(x, w, "norm_1", eps), w, relative_logits, eps)
    x = x + y * w.get("layer_scale_1/gamma", 1.0)
    y = norm(x, w, "norm_2", eps) @ w["dense_1/kernel"] + w["dense_1/bias"]
    if gated:
        gate, value = np.split(y, 2, axis=-1)
        y = ACTIVATIONS[activation](gate) * value
    else:
        y = ACTIVATIONS[activation](y)
    return x + (y @ w["dense_2/kernel"] + w["dense_2/bias"]) * w.get("layer_scale_2/gamma", 1.0)


def block_weights(block):
    """The numpy weights of a keras_vit `EncoderBlock`, keyed for `encoder_block`."""
    out = {}
    for v in block.weights:
        parts = v.path.split("/")
        key = parts[-1] if parts[-2] in ("attention",) else "/".join(parts[-2:])
        out[key] = np.asarray(v.numpy(), np.float64)
    return out
