import keras
import numpy as np
import pytest
from keras import ops

from keras_vit.layers import EncoderBlock, LayerScale, MAPHead, Mlp
from tests import reference
from tests.layer_checks import check_layer, randomize_weights

X = np.random.default_rng(2).normal(size=(2, 5, 8)).astype("float32")


def test_standard_checks(tmp_path):
    assert check_layer(EncoderBlock(2, 16, dropout_rate=0.1, drop_path_rate=0.1), tmp_path, X).shape == X.shape
    assert check_layer(Mlp(16), tmp_path, X).shape == X.shape


def test_matches_reference_pre_norm_block():
    block = EncoderBlock(num_heads=2, mlp_dim=16)
    block.build(X.shape)
    randomize_weights(block)
    weights = reference.block_weights(block)
    expected = reference.encoder_block(X.astype(np.float64), weights)
    np.testing.assert_allclose(np.asarray(block(X)), expected, atol=1e-5)


def test_official_numerics_epsilon_and_tanh_gelu():
    block = EncoderBlock(num_heads=2, mlp_dim=16)
    block.build(X.shape)
    assert block.norm_1.epsilon == block.norm_2.epsilon == 1e-6
    mlp = Mlp(16)
    mlp.build(X.shape)
    randomize_weights(mlp, scale=1.0)
    w = {f"{v.path.split('/')[-2]}/{v.name}": v.numpy() for v in mlp.weights}
    hidden = X @ w["dense_1/kernel"] + w["dense_1/bias"]
    tanh_out = reference.gelu_tanh(hidden) @ w["dense_2/kernel"] + w["dense_2/bias"]
    np.testing.assert_allclose(np.asarray(mlp(X)), tanh_out, atol=1e-4)
    from scipy.special import erf
    erf_out = (0.5 * hidden * (1 + erf(hidden / np.sqrt(2)))) @ w["dense_2/kernel"] + w["dense_2/bias"]
    assert np.abs(np.asarray(mlp(X)) - erf_out).max() > 1e-3  # exact GELU would differ


def test_returns_attention_weights():
    out, weights = EncoderBlock(num_heads=2, mlp_dim=16)(X, return_attention_scores=True)
    assert out.shape == X.shape and weights.shape == (2, 2, 5, 5)


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_the_output_spec_it_states_is_what_it_computes(policy):
    """The block states its output spec, so that building a model does not trace it: it must be what a call gives."""
    block = EncoderBlock(num_heads=2, mlp_dim=16, dtype=policy)
    for dtype in ("float32", "bfloat16"):
        stated = block(keras.KerasTensor((None, 5, 8), dtype=dtype))
        computed = block(ops.zeros((3, 5, 8), dtype=dtype))
        assert stated.shape == (None, 5, 8) and stated.dtype == keras.backend.standardize_dtype(computed.dtype)
    traced = keras.layers.Layer.compute_output_spec(block, keras.KerasTensor((3, None, 8), dtype=block.compute_dtype))
    assert traced.shape == block(keras.KerasTensor((3, None, 8))).shape  # Keras' default: trace `call`


def test_dropout_and_drop_path_only_in_training():
    block = EncoderBlock(2, 16, dropout_rate=0.5, drop_path_rate=0.5)
    np.testing.assert_array_equal(np.asarray(block(X)), np.asarray(block(X)))
    assert not np.allclose(np.asarray(block(X, training=True)), np.asarray(block(X)))


def test_bad_width():
    with pytest.raises(ValueError, match="received width=8"):
        EncoderBlock(num_heads=3, mlp_dim=16)(X)


@pytest.mark.parametrize("approximate, fused_gelu", [(True, b"GeluApproximate"), (False, b"GeluExact")])
def test_tensorflow_runs_the_mlp_matmul_bias_and_gelu_as_one_kernel(approximate, fused_gelu):
    """In TensorFlow's graph, grappler's remapper fuses matmul, bias and GELU only in the form `Mlp` writes
    (2-D matmul, BiasAdd); with Dense on (batch, tokens, width) the GELU ran as separate ops."""
    import tensorflow as tf
    from tensorflow.python.eager import context
    from tensorflow.python.util import _pywrap_util_port

    if not _pywrap_util_port.IsMklEnabled():
        pytest.skip("TensorFlow without oneDNN (TF_ENABLE_ONEDNN_OPTS=0 or not x86) has no fused GELU kernel")
    mlp = Mlp(16, gelu_approximate=approximate)
    forward = tf.function(lambda x: mlp(x))
    context.enable_run_metadata()  # before the first call: the optimized graphs are recorded as it instantiates
    try:
        forward(X)
        metadata = context.export_run_metadata()
    finally:
        context.disable_run_metadata()
    fused = [list(node.attr["fused_ops"].list.s) for function in metadata.function_graphs
             for graph in function.partition_graphs for node in graph.node if node.attr["fused_ops"].list.s]
    assert [b"BiasAdd", fused_gelu] in fused and [b"BiasAdd"] in fused, fused


def test_a_quantized_mlp_computes_as_its_dense_layers():
    """`keras.Model.quantize` makes the Dense kernels int8, which only Dense's own call reads right."""
    mlp = Mlp(16)
    mlp.build(X.shape)
    randomize_weights(mlp, scale=1.0)
    float_outputs = np.asarray(mlp(X))
    for dense in (mlp.dense_1, mlp.dense_2):
        dense.quantize("int8")
    expected = np.asarray(mlp.dense_2(ops.gelu(mlp.dense_1(X), approximate=True)))
    np.testing.assert_allclose(np.asarray(mlp(X)), expected, atol=1e-6)
    assert 0 < np.abs(expected - float_outputs).max() < 0.1 * np.abs(float_outputs).max()


@pytest.mark.parametrize("rates, count", [(dict(), 0), (dict(dropout_rate=0.1), 2),
                                          (dict(dropout_rate=0.1, attention_dropout_rate=0.1, drop_path_rate=0.1), 4)])
def test_seed_generators_are_every_random_draw_of_the_block(rates, count):
    # Remat restores these before recomputing: a random layer missing from the list would draw other masks.
    block = EncoderBlock(num_heads=2, mlp_dim=16, **rates)
    block.build((2, 5, 8))
    states = {id(g.state) for g in block.seed_generators()}
    assert len(states) == count
    assert states == {id(v) for v in block.non_trainable_variables}  # every seed state Keras tracks in the block


OPTIONS = dict(activation="quick_gelu", qkv_bias="qv", layer_scale_init=0.1)


def test_standard_checks_with_every_block_option(tmp_path):
    block = EncoderBlock(2, 16, dropout_rate=0.1, **OPTIONS)
    assert check_layer(block, tmp_path, X).shape == X.shape
    assert {w.path.split("/", 1)[1] for w in block.weights} >= {"layer_scale_1/gamma", "layer_scale_2/gamma"}
    assert check_layer(LayerScale(1e-5), tmp_path, X).shape == X.shape


@pytest.mark.parametrize("options", [dict(layer_scale_init=0.1), dict(gelu_approximate=False), OPTIONS])
def test_block_options_match_the_reference(options):
    """LayerScale multiplies each branch by its own gamma (timm's ls1/ls2) before the residual sum."""
    block = EncoderBlock(num_heads=2, mlp_dim=16, **options)
    block.build(X.shape)
    randomize_weights(block)
    weights = reference.block_weights(block)
    activation = options.get("activation", "gelu_tanh" if options.get("gelu_approximate", True) else "gelu")
    expected = reference.encoder_block(X.astype(np.float64), weights, activation=activation)
    np.testing.assert_allclose(np.asarray(block(X)), expected, atol=1e-5)
    if "layer_scale_init" in options:  # the gammas count: without them the reference computes something else
        unscaled = {k: v for k, v in weights.items() if not k.startswith("layer_scale")}
        assert np.abs(reference.encoder_block(X.astype(np.float64), unscaled, activation=activation)
                      - expected).max() > 1e-2


def test_layer_scale_starts_at_its_init_value_and_multiplies():
    block = EncoderBlock(num_heads=2, mlp_dim=16, layer_scale_init=1e-5)
    block.build(X.shape)
    for scale in block.layer_scales:
        np.testing.assert_array_equal(scale.gamma.numpy(), np.full((8,), 1e-5, "float32"))
    gamma = np.arange(1, 9, dtype="float32")
    scale = LayerScale(0.5)
    scale.build(X.shape)
    scale.gamma.assign(gamma)
    np.testing.assert_array_equal(np.asarray(scale(X)), X * gamma)
    with pytest.raises(ValueError, match=r"`init_value` must be a float in \(0.0, inf\); received init_value=0"):
        LayerScale(0)


def test_quick_gelu_is_x_times_sigmoid_of_1_702_x():
    mlp = Mlp(16, activation="quick_gelu")
    mlp.build(X.shape)
    randomize_weights(mlp, scale=1.0)
    w = {f"{v.path.split('/')[-2]}/{v.name}": v.numpy().astype(np.float64) for v in mlp.weights}
    hidden = X @ w["dense_1/kernel"] + w["dense_1/bias"]
    quick = (hidden / (1 + np.exp(-1.702 * hidden))) @ w["dense_2/kernel"] + w["dense_2/bias"]
    np.testing.assert_allclose(np.asarray(mlp(X)), quick, atol=1e-5)
    tanh = reference.gelu_tanh(hidden) @ w["dense_2/kernel"] + w["dense_2/bias"]
    assert np.abs(np.asarray(mlp(X)) - tanh).max() > 1e-2  # a GELU would differ
    assert (mlp.activation, mlp.gelu_approximate) == ("quick_gelu", False)


def test_layer_configs_of_older_files_keep_their_activation():
    """Before `activation`, Mlp, EncoderBlock and MAPHead configs held `gelu_approximate` alone: GELU."""
    for approximate in (True, False):
        mlp = Mlp.from_config({"mlp_dim": 16, "dropout_rate": 0.0, "gelu_approximate": approximate})
        block = EncoderBlock.from_config({"num_heads": 2, "mlp_dim": 16, "gelu_approximate": approximate})
        head = MAPHead.from_config({"num_heads": 2, "mlp_dim": 16, "gelu_approximate": approximate})
        for layer in (mlp, block.mlp, head.mlp):
            assert (layer.activation, layer.gelu_approximate) == ("gelu", approximate)
    quick = EncoderBlock(2, 16, gelu_approximate=True, activation="quick_gelu")
    assert quick.gelu_approximate is quick.mlp.gelu_approximate is False  # QuickGELU has no GELU form
    with pytest.raises(ValueError, match=r"`activation` must be one of \('gelu', 'quick_gelu', 'silu'\); received "
                                         r"activation='relu'"):
        Mlp(16, activation="relu")
