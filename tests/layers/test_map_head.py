import numpy as np
import pytest

from keras_vit.layers import MAPHead
from tests.layer_checks import check_layer, randomize_weights

TOKENS = np.random.default_rng(1).normal(size=(2, 6, 8)).astype("float32")


def test_standard_checks(tmp_path):
    assert check_layer(MAPHead(num_heads=2, mlp_dim=16, num_prefix_tokens=1), tmp_path, TOKENS).shape == (2, 8)


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def _reference(weights, tokens, heads, prefix, epsilon=1e-6):
    """big_vision's MAPHead in float64 NumPy: probe attends over the patch tokens, then LayerNorm and MLP residual."""
    w = {name.split("/")[-1] if "/" not in name else name: np.float64(v) for name, v in weights.items()}
    x = np.float64(tokens[:, prefix:])
    probe = np.broadcast_to(w["probe"], (len(x), 1, x.shape[-1]))
    q = np.einsum("bqd,dhk->bqhk", probe, w["query_kernel"]) + w["query_bias"]
    k = np.einsum("btd,dhk->bthk", x, w["key_kernel"]) + w["key_bias"]
    v = np.einsum("btd,dhk->bthk", x, w["value_kernel"]) + w["value_bias"]
    logits = np.einsum("bqhk,bthk->bhqt", q / np.sqrt(q.shape[-1]), k)
    attn = np.exp(logits - logits.max(-1, keepdims=True))
    attn /= attn.sum(-1, keepdims=True)
    out = np.einsum("bqhk,hkd->bqd", np.einsum("bhqt,bthk->bqhk", attn, v), w["output_kernel"]) + w["output_bias"]
    mean, var = out.mean(-1, keepdims=True), out.var(-1, keepdims=True)
    y = (out - mean) / np.sqrt(var + epsilon) * w["norm/gamma"] + w["norm/beta"]
    hidden = _gelu_tanh(y @ w["mlp/dense_1/kernel"] + w["mlp/dense_1/bias"])
    return (out + hidden @ w["mlp/dense_2/kernel"] + w["mlp/dense_2/bias"])[:, 0], attn


def test_values_match_big_vision_reference():
    layer = MAPHead(num_heads=2, mlp_dim=16, num_prefix_tokens=2)
    layer.build(TOKENS.shape)
    randomize_weights(layer)
    weights = {w.path.split("/", 1)[1] if w.path.count("/") > 1 else w.name: w.numpy() for w in layer.weights}
    expected, attention = _reference(weights, TOKENS, heads=2, prefix=2)
    pooled, scores = layer(TOKENS, return_attention_scores=True)
    np.testing.assert_allclose(np.asarray(pooled), expected, atol=1e-5)
    np.testing.assert_allclose(np.asarray(scores), attention, atol=1e-6)
    assert tuple(scores.shape) == (2, 2, 1, 4)  # the two prefix tokens are left out


def test_weights_have_big_vision_shapes():
    layer = MAPHead(num_heads=2, mlp_dim=16)
    layer.build((None, 5, 8))
    shapes = {w.path: tuple(w.shape) for w in layer.weights}
    name = layer.name
    assert shapes[f"{name}/probe"] == (1, 1, 8)
    assert shapes[f"{name}/query_kernel"] == (8, 2, 4) and shapes[f"{name}/query_bias"] == (2, 4)
    assert shapes[f"{name}/output_kernel"] == (2, 4, 8) and shapes[f"{name}/output_bias"] == (8,)
    assert shapes[f"{name}/norm/gamma"] == (8,)
    assert shapes[f"{name}/mlp/dense_1/kernel"] == (8, 16) and shapes[f"{name}/mlp/dense_2/kernel"] == (16, 8)


def test_bad_arguments():
    with pytest.raises(ValueError, match="`num_heads` must be an int >= 1; received num_heads=0"):
        MAPHead(num_heads=0, mlp_dim=4)
    with pytest.raises(ValueError, match="divisible by `num_heads`=3; received width=8"):
        MAPHead(num_heads=3, mlp_dim=4)(TOKENS)
    with pytest.raises(ValueError, match=r"expects \(batch, tokens, width\)"):
        MAPHead(num_heads=2, mlp_dim=4)(np.zeros((2, 8), "float32"))
