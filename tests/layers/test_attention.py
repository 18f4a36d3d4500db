import keras
import numpy as np
import pytest

from keras_vit.layers import MultiHeadSelfAttention, attention
from keras_vit.layers.attention import relative_2d_index
from tests import reference
from tests.layer_checks import check_layer, randomize_weights

X = np.random.default_rng(1).normal(size=(2, 5, 8)).astype("float32")


def _weights(layer):
    return {v.name: np.asarray(v.numpy(), np.float64) for v in layer.weights}


@pytest.mark.parametrize("relative", [None, "relative", "relative_2d"])
def test_standard_checks(tmp_path, relative):
    layer = MultiHeadSelfAttention(2, relative_position=relative, grid_size=(2, 2), num_prefix_tokens=1)
    assert check_layer(layer, tmp_path, X).shape == X.shape


def test_official_kernel_layout():
    layer = MultiHeadSelfAttention(num_heads=2)
    layer.build((None, 5, 8))
    shapes = {v.name: tuple(v.shape) for v in layer.weights}
    assert shapes == {
        "query_kernel": (8, 2, 4), "query_bias": (2, 4),
        "key_kernel": (8, 2, 4), "key_bias": (2, 4),
        "value_kernel": (8, 2, 4), "value_bias": (2, 4),
        "output_kernel": (2, 4, 8), "output_bias": (8,),
    }


def test_matches_reference_attention_and_returns_weights():
    layer = MultiHeadSelfAttention(num_heads=2)
    layer.build(X.shape)
    randomize_weights(layer)
    out, weights = layer(X, return_attention_scores=True)
    expected, expected_weights = reference.attention(X.astype(np.float64), _weights(layer))
    np.testing.assert_allclose(np.asarray(out), expected, atol=1e-5)
    np.testing.assert_allclose(np.asarray(weights), expected_weights, atol=1e-6)
    np.testing.assert_allclose(np.asarray(weights).sum(-1), 1.0, atol=1e-6)


def test_swapping_query_and_key_changes_the_output():
    # Guards the reference check above: q/k are not interchangeable here.
    layer = MultiHeadSelfAttention(num_heads=2)
    layer.build(X.shape)
    randomize_weights(layer)
    swapped = _weights(layer)
    swapped["query_kernel"], swapped["key_kernel"] = swapped["key_kernel"], swapped["query_kernel"]
    out = np.asarray(layer(X))
    assert np.abs(out - reference.attention(X.astype(np.float64), swapped)[0]).max() > 1e-2


def test_relative_1d_adds_query_dot_offset_embedding():
    # Paper, Appendix D.4: logit(i, j) += q_i . E[p_i - p_j] for every head.
    layer = MultiHeadSelfAttention(2, relative_position="relative", grid_size=(2, 2), num_prefix_tokens=1)
    layer.build(X.shape)
    randomize_weights(layer)
    table = _weights(layer)["relative_embedding"]  # (2 * 5 - 1, heads, head_dim)
    assert table.shape == (9, 2, 4)

    def relative_logits(q):
        length = q.shape[1]
        out = np.zeros((q.shape[0], q.shape[2], length, length))
        for i in range(length):
            for j in range(length):
                out[:, :, i, j] = np.einsum("bhk,hk->bh", q[:, i], table[i - j + length - 1])
        return out

    expected, _ = reference.attention(X.astype(np.float64), _weights(layer), relative_logits)
    np.testing.assert_allclose(np.asarray(layer(X)), expected, atol=1e-5)


def test_relative_2d_index_by_hand():
    # Grid 2x2 (patches a b / c d) after one prefix token; table 3x3 + 3 extras.
    index = relative_2d_index((2, 2), 1)
    center = 1 * 3 + 1  # offset (0, 0)
    assert index[1, 1] == index[4, 4] == center
    assert index[1, 2] == 1 * 3 + 0  # a vs b: (0, -1)
    assert index[4, 1] == 2 * 3 + 2  # d vs a: (+1, +1)
    assert index[0, 3] == 9 and index[3, 0] == 10 and index[0, 0] == 11


def test_relative_2d_matches_reference():
    layer = MultiHeadSelfAttention(2, relative_position="relative_2d", grid_size=(2, 2), num_prefix_tokens=1)
    layer.build(X.shape)
    randomize_weights(layer)
    w = _weights(layer)
    flat = np.concatenate([w["relative_embedding"].reshape(9, 2, 4), w["prefix_relative_embedding"]])
    index = relative_2d_index((2, 2), 1)

    def rel(q):
        return np.einsum("bqhk,qthk->bhqt", q, flat[index])

    expected, _ = reference.attention(X.astype(np.float64), w, rel)
    np.testing.assert_allclose(np.asarray(layer(X)), expected, atol=1e-5)


def test_relative_2d_refuses_another_sequence_length():
    layer = MultiHeadSelfAttention(2, relative_position="relative_2d", grid_size=(2, 2), num_prefix_tokens=1)
    with pytest.raises(ValueError, match="received 7 tokens"):
        layer(np.zeros((1, 7, 8), "float32"))


def test_relative_tables_resize():
    layer = MultiHeadSelfAttention(2, relative_position="relative_2d", grid_size=(2, 2), num_prefix_tokens=1)
    layer.build(X.shape)
    randomize_weights(layer)
    resized = layer.resized_weights((3, 4))
    assert resized["relative_embedding"].shape == (5, 7, 2, 4)
    # Corner-aligned: the table's corners and centre offset (0, 0) are kept.
    table = layer.relative_embedding.numpy()
    np.testing.assert_allclose(resized["relative_embedding"][[0, -1]][:, [0, -1]], table[[0, -1]][:, [0, -1]],
                               atol=1e-6)
    np.testing.assert_allclose(resized["relative_embedding"][2, 3], table[1, 1], atol=1e-6)


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_heads=3), "divisible by `num_heads`=3"),
    (dict(num_heads=2, relative_position="2d"), "received relative_position='2d'"),
    (dict(num_heads=2, relative_position="relative"), "needs `grid_size`"),
    (dict(num_heads=2.7), r"`num_heads` must be an int >= 1; received num_heads=2.7"),  # was cut to 2
    (dict(num_heads=2, relative_position="relative", grid_size=2, num_prefix_tokens=-1),
     r"`num_prefix_tokens` must be an int >= 0; received num_prefix_tokens=-1"),
])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MultiHeadSelfAttention(**kwargs)(X)


def test_fused_attention_is_asked_where_the_weights_are_not_needed_and_its_answer_used(monkeypatch):
    """The call site of cuDNN's kernel, on any backend: a stand-in answers zeros where it is asked."""
    asked = []

    def zeros(query, key, value):
        asked.append(tuple(query.shape))
        return keras.ops.zeros_like(value)

    monkeypatch.setattr(attention, "cudnn_attention", zeros)
    # Not where the weights are needed: asked for, dropped out in training, or given relative logits.
    MultiHeadSelfAttention(num_heads=2)(X, return_attention_scores=True)
    MultiHeadSelfAttention(num_heads=2, attention_dropout_rate=0.1)(X, training=True)
    MultiHeadSelfAttention(2, relative_position="relative", grid_size=(2, 2), num_prefix_tokens=1)(X)
    assert not asked
    layer = MultiHeadSelfAttention(num_heads=2, attention_dropout_rate=0.1)
    layer.build(X.shape)
    randomize_weights(layer)
    # Asked otherwise (at inference, and in training without dropout on the weights), and what it
    # answers is attended: zeros leave only the output bias.
    for out in (layer(X), MultiHeadSelfAttention(num_heads=2)(X, training=True)):
        np.testing.assert_allclose(np.asarray(out)[:, 1:], np.asarray(out)[:, :-1], atol=1e-7)
    np.testing.assert_allclose(np.asarray(layer(X)), np.broadcast_to(layer.output_bias.numpy(), X.shape),
                               atol=1e-7)
    assert asked == [(2, 5, 2, 4)] * 3


ON_GPU = keras.backend.backend() == "jax" and __import__("jax").default_backend() == "gpu"


@pytest.mark.skipif(ON_GPU, reason="the test below runs on a GPU")
def test_no_fused_attention_off_a_gpu():
    q = keras.ops.convert_to_tensor(X.reshape(2, 5, 2, 4), "bfloat16")
    assert attention.cudnn_attention(q, q, q) is None


@pytest.mark.skipif(not ON_GPU, reason="needs Keras' JAX backend on a GPU (cuDNN's fused attention); the call "
                                       "site is covered above on any backend")
def test_fused_attention_on_a_gpu_is_as_close_to_float32_as_the_matmuls():
    import jax

    x = np.random.default_rng(2).normal(size=(4, 197, 768)).astype("float32")
    exact = MultiHeadSelfAttention(num_heads=12)
    exact.build(x.shape)
    randomize_weights(exact, scale=0.05)
    half = MultiHeadSelfAttention(num_heads=12, dtype="mixed_bfloat16")
    half.build(x.shape)
    half.set_weights(exact.get_weights())
    # The fused kernel runs at ViT's 197 tokens, in the forward pass and under a gradient (padded).
    ran = []

    def attended_sum(q):
        out = attention.cudnn_attention(q, q, q)
        ran.append(out is not None)
        return (q if out is None else out).astype("float32").sum()

    q = keras.ops.convert_to_tensor(x.reshape(4, 197, 12, 64), "bfloat16")
    attended_sum(q), jax.grad(attended_sum)(q)
    assert ran == [True, True]

    cotangent = np.random.default_rng(3).normal(size=x.shape).astype("float32")

    def outputs_and_gradients(layer, **kwargs):
        trainable = [v.value for v in layer.trainable_variables]
        fixed = [v.value for v in layer.non_trainable_variables]

        def objective(values):
            out = layer.stateless_call(values, fixed, x, **kwargs)[0]
            out = (out[0] if kwargs else out).astype("float32")
            return (out * cotangent).sum(), out

        gradients, out = jax.grad(objective, has_aux=True)(trainable)
        return {"outputs": np.asarray(out), "gradients": np.concatenate([np.ravel(np.asarray(g, "float32"))
                                                                          for g in gradients])}

    exact_run = outputs_and_gradients(exact)
    fused_run = outputs_and_gradients(half)
    matmul_run = outputs_and_gradients(half, return_attention_scores=True)  # the weights need the matmuls
    for name, exact_value in exact_run.items():
        fused, matmuls = (np.linalg.norm(run[name] - exact_value) / np.linalg.norm(exact_value)
                          for run in (fused_run, matmul_run))
        assert fused < 3e-2 and fused < 1.5 * matmuls + 1e-3, (name, fused, matmuls)


@pytest.mark.parametrize("qkv_bias", ["none", "qv"])
def test_standard_checks_without_biases(tmp_path, qkv_bias):
    assert check_layer(MultiHeadSelfAttention(2, qkv_bias=qkv_bias), tmp_path, X).shape == X.shape


@pytest.mark.parametrize("qkv_bias, biases", [("all", {"query_bias", "key_bias", "value_bias"}),
                                               ("qv", {"query_bias", "value_bias"}), ("none", set())])
def test_qkv_bias_says_which_projections_have_a_bias_weight(qkv_bias, biases):
    layer = MultiHeadSelfAttention(num_heads=2, qkv_bias=qkv_bias)
    layer.build(X.shape)
    names = {v.name for v in layer.weights}
    assert {name for name in names if name.endswith("_bias")} == biases | {"output_bias"}


@pytest.mark.parametrize("qkv_bias", ["none", "qv"])
def test_a_missing_bias_computes_as_a_zero_bias(qkv_bias):
    """EVA/BEiT's q/v bias: the key's bias is a fixed zero, so the layer is the full one with key_bias = 0."""
    layer = MultiHeadSelfAttention(num_heads=2, qkv_bias=qkv_bias)
    layer.build(X.shape)
    randomize_weights(layer)
    weights = _weights(layer)
    full = MultiHeadSelfAttention(num_heads=2)
    full.build(X.shape)
    for variable in full.weights:
        variable.assign(weights.get(variable.name, np.zeros(variable.shape)))
    out, scores = layer(X, return_attention_scores=True)
    expected, expected_scores = reference.attention(X.astype(np.float64), weights)
    np.testing.assert_allclose(np.asarray(out), expected, atol=1e-5)
    np.testing.assert_allclose(np.asarray(scores), expected_scores, atol=1e-6)
    np.testing.assert_allclose(np.asarray(out), np.asarray(full(X)), atol=1e-6)
    if qkv_bias == "qv":  # the query and value biases it keeps count
        full.value_bias.assign(np.zeros(full.value_bias.shape))
        assert np.abs(np.asarray(full(X)) - np.asarray(out)).max() > 1e-2


def test_qkv_bias_is_checked():
    with pytest.raises(ValueError, match=r"`qkv_bias` must be one of \('all', 'none', 'qv'\); received qkv_bias=False"):
        MultiHeadSelfAttention(2, qkv_bias=False)
