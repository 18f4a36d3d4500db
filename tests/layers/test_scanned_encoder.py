import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_vit.layers import EncoderBlock, ScannedEncoder
from keras_vit.layers.keras_internals import holds_memory
from keras_vit.layers.scanned_encoder import block_name
from tests.layer_checks import check_layer, randomize_weights

X = np.random.default_rng(3).normal(size=(2, 5, 8)).astype("float32")
CONFIG = dict(num_heads=2, mlp_dim=16, num_prefix_tokens=1)


def scanned_and_blocks(num_layers=3, **config):
    """A ScannedEncoder and the EncoderBlocks holding the same (random) weights."""
    scanned = ScannedEncoder(num_layers, {**CONFIG, **config})
    scanned.build(X.shape)
    randomize_weights(scanned)
    return scanned, scanned.unstack()


def run_blocks(blocks, x, training=False):
    for block in blocks:
        x = block(x, training=training)
    return x


def test_standard_checks(tmp_path):
    assert check_layer(ScannedEncoder(3, CONFIG), tmp_path, X).shape == X.shape


def test_weights_are_the_block_weights_stacked():
    scanned = ScannedEncoder(4, CONFIG)
    scanned.build(X.shape)
    block = EncoderBlock(**CONFIG)
    block.build(X.shape)
    assert [(w.name, tuple(w.shape)) for w in scanned.weights] == [
        (w.path.split("/", 1)[1].replace("/", "-"), (4, *w.shape)) for w in block.weights
    ]
    # Each block's slice is its own draw of the block's initializer.
    kernel = next(w for w in scanned.weights if w.name == "mlp-dense_1-kernel").numpy()
    assert not np.array_equal(kernel[0], kernel[1])
    assert abs(kernel.std() - np.sqrt(6 / (8 + 16) / 3)) < 0.04  # glorot_uniform's, per block


@pytest.mark.parametrize("relative_position", [None, "relative"])
def test_equals_the_blocks_it_stacks_eager_and_under_xla(relative_position):
    grid_size = (1, 4) if relative_position else None
    scanned, blocks = scanned_and_blocks(relative_position=relative_position, grid_size=grid_size)
    expected = np.asarray(run_blocks(blocks, X))
    np.testing.assert_allclose(np.asarray(scanned(X)), expected, atol=1e-6)
    compiled = tf.function(lambda x: scanned(x), jit_compile=True)
    np.testing.assert_allclose(np.asarray(compiled(X)), expected, atol=1e-5)


def test_xla_gradients_through_the_loop_equal_the_unrolled_blocks():
    scanned, blocks = scanned_and_blocks()

    @tf.function(jit_compile=True)
    def scanned_grads(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.sin(scanned(x, training=True)))
        return tape.gradient(loss, [w.value for w in scanned.weights])

    @tf.function(jit_compile=True)
    def block_grads(x):
        weights = [w.value for block in blocks for w in block.weights]
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.sin(run_blocks(blocks, x, training=True)))
        return tape.gradient(loss, weights)

    per_block = block_grads(tf.constant(X))
    per_kind = len(scanned.weights)
    for j, grad in enumerate(scanned_grads(tf.constant(X))):
        expected = np.stack([per_block[i * per_kind + j] for i in range(len(blocks))])
        np.testing.assert_allclose(np.asarray(grad), expected, atol=1e-5, err_msg=scanned.weights[j].name)
        if scanned.weights[j].name != "attention-key_bias":  # softmax ignores a key bias
            assert np.abs(expected).max() > 1e-3


def test_xla_fit_with_an_unknown_batch_size_trains():
    scanned = ScannedEncoder(2, {**CONFIG, "dropout_rate": 0.1, "drop_path_rate": 0.1})
    inputs = keras.Input((5, 8))
    model = keras.Model(inputs, scanned(inputs))
    model.compile(optimizer="adam", loss="mse", jit_compile=True)
    before = [w.numpy().copy() for w in scanned.weights]
    model.fit(X, np.ones_like(X), batch_size=2, epochs=2, verbose=0)  # numpy: the batch size is unknown
    assert all(not np.array_equal(b, w.numpy()) for b, w in zip(before, scanned.weights, strict=True))


def test_the_template_block_holds_no_memory_and_is_not_saved(tmp_path):
    scanned = ScannedEncoder(2, CONFIG)
    inputs = keras.Input((5, 8))
    model = keras.Model(inputs, scanned(inputs))
    model.compile(optimizer="adam", loss="mse", jit_compile=True)
    dataset = tf.data.Dataset.from_tensor_slices((X, X)).batch(2, drop_remainder=True)
    model.fit(dataset, epochs=1, verbose=0, shuffle=False)  # a dataset is ordered already
    template = scanned.template_block()
    # Keras internals the layer relies on (keras_vit.layers.keras_internals): its variables stay unallocated.
    assert template.weights and not any(holds_memory(v) for v in template.weights)
    assert len(model.weights) == len(template.weights)
    model.save(tmp_path / "m.keras")
    assert len(keras.models.load_model(tmp_path / "m.keras").weights) == len(template.weights)


@pytest.mark.parametrize("num_layers", [0, 2.0, None])
def test_bad_num_layers(num_layers):
    with pytest.raises(ValueError, match=f"received num_layers={num_layers!r}"):
        ScannedEncoder(num_layers, CONFIG)


def branch_of_ones(num_layers, **rates):
    """A ScannedEncoder whose attention branch adds 1 to every element and whose MLP branch adds 0.

    With every other weight 0, the normalised tokens are 0, so attention
    returns its output bias and the MLP its second bias.
    """
    scanned = ScannedEncoder(num_layers, {**CONFIG, "num_prefix_tokens": 0, **rates})
    scanned.build((None, 2, 8))
    for weight in scanned.weights:
        weight.assign(np.ones(weight.shape) if weight.name == "attention-output_bias" else np.zeros(weight.shape))
    return scanned


@pytest.mark.parametrize("compiled", [False, True])
def test_stochastic_depth_rises_linearly_over_the_blocks(compiled):
    scanned = branch_of_ones(3, drop_path_rate=0.5)  # keep 1, 0.75 and 0.5
    run = tf.function(scanned, jit_compile=True) if compiled else scanned
    x = np.zeros((4000, 2, 8), "float32")
    added = np.asarray(run(x, training=True))
    assert np.allclose(added, added[:, :1, :1])  # one draw per example and block
    added = added[:, 0, 0]

    def near(*values):
        return np.isclose(added[:, None], values, atol=1e-5).any(axis=1)

    kept_1, kept_2 = near(1 + 4 / 3, 3 + 4 / 3), near(3, 3 + 4 / 3)
    assert np.all(kept_1 | kept_2 | near(1))  # block 0 always adds 1, the others 1 / keep or 0
    assert abs(kept_1.mean() - 0.75) < 0.04 and abs(kept_2.mean() - 0.5) < 0.04
    assert abs((kept_1 & kept_2).mean() - 0.75 * 0.5) < 0.04  # the blocks draw independently
    np.testing.assert_allclose(np.asarray(run(x, training=False)), 3.0)


def test_each_block_and_call_draws_its_own_dropout_mask():
    scanned = branch_of_ones(2, dropout_rate=0.5)
    x = np.zeros((1000, 2, 8), "float32")
    first, second = (np.asarray(scanned(x, training=True)) for _ in range(2))
    # Each block adds 0 or 2 per element: 0, 2 or 4 in all, 2 half the time if the masks are independent.
    assert set(np.unique(first)) <= {0.0, 2.0, 4.0}
    assert abs(np.mean(first == 2.0) - 0.5) < 0.03
    assert np.mean(first == second) < 0.5
    np.testing.assert_allclose(np.asarray(scanned(x)), 2.0)


def test_xla_fit_with_every_dropout_trains_and_moves_the_seed():
    scanned = ScannedEncoder(2, {**CONFIG, "dropout_rate": 0.1, "attention_dropout_rate": 0.1,
                                 "drop_path_rate": 0.2})
    inputs = keras.Input((5, 8), batch_size=2)
    model = keras.Model(inputs, scanned(inputs))
    model.compile(optimizer="adam", loss="mse", jit_compile=True)
    seed = scanned.seed_generator.state.numpy().copy()
    history = model.fit(X, np.ones_like(X), batch_size=2, epochs=3, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert not np.array_equal(seed, scanned.seed_generator.state.numpy())


def test_unstack_gives_the_blocks_each_weight_slice_under_the_unrolled_names():
    scanned, blocks = scanned_and_blocks(drop_path_rate=0.2)
    assert [block.name for block in blocks] == [block_name(i) for i in range(3)] == ["encoder_block_0",
                                                                                      "encoder_block_1",
                                                                                      "encoder_block_2"]
    assert [block.drop_path_rate for block in blocks] == pytest.approx([0.0, 0.1, 0.2])
    kernel = next(w for w in scanned.weights if w.name == "mlp-dense_1-kernel").numpy()
    for i, block in enumerate(blocks):
        np.testing.assert_array_equal(block.mlp.dense_1.kernel.numpy(), kernel[i])
        assert not np.array_equal(kernel[i], kernel[(i + 1) % 3])


def test_block_weights_and_paths_are_each_block_slice_by_its_path():
    scanned, blocks = scanned_and_blocks()
    paths = scanned.block_weight_paths()
    assert paths == [w.path.split("/", 1)[1] for w in blocks[0].weights]
    assert "attention/query_kernel" in paths and "mlp/dense_2/bias" in paths
    for i, block in enumerate(blocks):
        got = scanned.block_weights(i)
        assert list(got) == paths
        for weight, path in zip(block.weights, paths, strict=True):
            np.testing.assert_array_equal(got[path], weight.numpy())


def test_unrolled_weights_name_each_slice_as_the_unrolled_model():
    scanned = ScannedEncoder(2, CONFIG)
    scanned.build(X.shape)
    entries = list(scanned.unrolled_weights())
    assert len(entries) == 2 * len(scanned.weights)
    assert ("encoder_block_1/mlp/dense_1/kernel", 1) in {(path, block) for path, _, block in entries}
    for path, variable, block in entries:
        assert path == f"encoder_block_{block}/{variable.name.replace('-', '/')}"


@pytest.mark.parametrize("relative_position", [None, "relative"])
def test_call_block_is_that_block_alone_with_its_attention_weights(relative_position):
    grid_size = (1, 4) if relative_position else None
    scanned, blocks = scanned_and_blocks(relative_position=relative_position, grid_size=grid_size)
    tokens = X
    for i, block in enumerate(blocks):
        expected, expected_scores = block(tokens, return_attention_scores=True)
        got, scores = scanned.call_block(i, tokens, return_attention_scores=True)
        np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=1e-6)
        np.testing.assert_allclose(np.asarray(scores), np.asarray(expected_scores), atol=1e-6)
        np.testing.assert_allclose(np.asarray(scanned.call_block(i, tokens)), np.asarray(expected), atol=1e-6)
        tokens = np.asarray(expected)
    np.testing.assert_allclose(np.asarray(scanned(X)), tokens, atol=1e-5)


def test_call_block_in_training_draws_that_block_s_stochastic_depth():
    scanned = branch_of_ones(3, drop_path_rate=0.5)  # blocks keep their branch with 1, 0.75, 0.5
    x = np.zeros((4000, 2, 8), "float32")
    np.testing.assert_allclose(np.asarray(scanned.call_block(0, x, training=True)), 1.0)
    added = np.asarray(scanned.call_block(2, x, training=True))[:, 0, 0]
    assert set(np.round(np.unique(added), 4)) == {0.0, 2.0} and abs(np.mean(added == 0) - 0.5) < 0.04


def test_stack_is_the_inverse_of_unstack():
    scanned, blocks = scanned_and_blocks(drop_path_rate=0.2)
    stacked = ScannedEncoder.stack(blocks, name="again")
    assert stacked.name == "again" and stacked.num_layers == 3 and stacked.drop_path_rate == pytest.approx(0.2)
    assert stacked.template_block().get_config() == scanned.template_block().get_config()
    for mine, theirs in zip(stacked.weights, scanned.weights, strict=True):
        assert mine.name == theirs.name
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
    np.testing.assert_allclose(np.asarray(stacked(X)), np.asarray(run_blocks(blocks, X)), atol=1e-6)


def test_load_blocks_takes_an_unrolled_encoder_s_weights():
    blocks = [EncoderBlock(**CONFIG, name=block_name(i)) for i in range(2)]
    for block in blocks:
        block.build(X.shape)
        randomize_weights(block)
    scanned = ScannedEncoder(2, CONFIG)
    scanned.build(X.shape)
    scanned.load_blocks(blocks)
    np.testing.assert_allclose(np.asarray(scanned(X)), np.asarray(run_blocks(blocks, X)), atol=1e-6)


def test_bad_blocks_and_indices_are_refused():
    scanned, blocks = scanned_and_blocks(drop_path_rate=0.2)
    for index in (3, -1, 1.0, True):
        with pytest.raises(ValueError, match=rf"block number in \[0, 3\); received index={index!r}"):
            scanned.block_weights(index)
        with pytest.raises(ValueError, match=rf"received index={index!r}"):
            scanned.call_block(index, X)
    with pytest.raises(ValueError, match="must be 3 built EncoderBlocks; received"):
        scanned.load_blocks(blocks[:2])
    with pytest.raises(ValueError, match="drop_path_rate"):
        ScannedEncoder.stack(blocks[::-1])  # the rates fall
    wider = EncoderBlock(num_heads=2, mlp_dim=32, num_prefix_tokens=1)
    wider.build(X.shape)
    with pytest.raises(ValueError, match=r"differ in \['mlp_dim'\]"):
        ScannedEncoder.stack([blocks[0], wider])
    message = r"'mlp/dense_1/kernel' of shape \(8, 32\); this encoder's blocks have \(8, 16\)"
    with pytest.raises(ValueError, match=message):
        scanned.load_blocks([*blocks[:2], wider])
    with pytest.raises(ValueError, match="must be built EncoderBlocks"):
        ScannedEncoder.stack([])


def test_block_options_scan_as_the_blocks_they_stack():
    """LayerScale's gammas stack as any block weight; q/v bias and QuickGELU run in the loop's block."""
    scanned, blocks = scanned_and_blocks(layer_scale_init=0.1, qkv_bias="qv", activation="quick_gelu")
    shapes = {w.name: tuple(w.shape) for w in scanned.weights}
    assert shapes["layer_scale_1-gamma"] == shapes["layer_scale_2-gamma"] == (3, 8)
    assert "attention-key_bias" not in shapes
    expected = np.asarray(run_blocks(blocks, X))
    np.testing.assert_allclose(np.asarray(scanned(X)), expected, atol=1e-6)
    compiled = tf.function(lambda x: scanned(x), jit_compile=True)
    np.testing.assert_allclose(np.asarray(compiled(X)), expected, atol=1e-5)
    # Each block's gamma slice starts at the init value.
    fresh = ScannedEncoder(3, {**CONFIG, "layer_scale_init": 0.1})
    fresh.build(X.shape)
    gamma = next(w for w in fresh.weights if w.name == "layer_scale_2-gamma").numpy()
    np.testing.assert_array_equal(gamma, np.full((3, 8), 0.1, "float32"))
