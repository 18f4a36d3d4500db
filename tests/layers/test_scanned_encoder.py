import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_vit.layers import EncoderBlock, ScannedEncoder
from keras_vit.layers.scanned_encoder import _unallocated_build
from tests.layer_checks import check_layer, randomize_weights

X = np.random.default_rng(3).normal(size=(2, 5, 8)).astype("float32")
CONFIG = dict(num_heads=2, mlp_dim=16, num_prefix_tokens=1)


def scanned_and_blocks(num_layers=3, **config):
    """A ScannedEncoder and the EncoderBlocks holding the same (random) weights."""
    config = {**CONFIG, **config}
    scanned = ScannedEncoder(num_layers, config)
    scanned.build(X.shape)
    randomize_weights(scanned)
    blocks = [EncoderBlock(**config) for _ in range(num_layers)]
    for i, block in enumerate(blocks):
        block.build(X.shape)
        for weight in block.weights:
            path = weight.path.split("/", 1)[1].replace("/", ".")
            weight.assign(next(w for w in scanned.weights if w.name == path)[i])
    return scanned, blocks


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
        (w.path.split("/", 1)[1].replace("/", "."), (4, *w.shape)) for w in block.weights
    ]
    # Each block's slice is its own draw of the block's initializer.
    kernel = next(w for w in scanned.weights if w.name == "mlp.dense_1.kernel").numpy()
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
        if scanned.weights[j].name != "attention.key_bias":  # softmax ignores a key bias
            assert np.abs(expected).max() > 1e-3


def test_xla_fit_with_an_unknown_batch_size_trains():
    scanned = ScannedEncoder(2, {**CONFIG, "dropout_rate": 0.1, "drop_path_rate": 0.1})
    inputs = keras.Input((5, 8))
    model = keras.Model(inputs, scanned(inputs))
    model.compile(optimizer="adam", loss="mse", jit_compile=True)
    before = [w.numpy().copy() for w in scanned.weights]
    model.fit(X, np.ones_like(X), batch_size=2, epochs=2, verbose=0)  # numpy: the batch size is unknown
    assert all(not np.array_equal(b, w.numpy()) for b, w in zip(before, scanned.weights))


def test_the_template_block_holds_no_memory_and_is_not_saved(tmp_path):
    scanned = ScannedEncoder(2, CONFIG)
    inputs = keras.Input((5, 8))
    model = keras.Model(inputs, scanned(inputs))
    model.compile(optimizer="adam", loss="mse", jit_compile=True)
    dataset = tf.data.Dataset.from_tensor_slices((X, X)).batch(2, drop_remainder=True)
    model.fit(dataset, epochs=1, verbose=0, shuffle=False)  # a dataset is ordered already
    template = scanned.template_block()
    # Keras internals the layer relies on: variables made in a stateless scope stay unallocated.
    assert template.weights and all(v._value is None for v in template.weights)
    assert len(model.weights) == len(template.weights)
    model.save(tmp_path / "m.keras")
    assert len(keras.models.load_model(tmp_path / "m.keras").weights) == len(template.weights)


def test_the_keras_internals_of_unallocated_build_still_hold():
    # `_unallocated_build` is keras_vit's one user of Keras internals (its docstring names them). When this
    # fails, the installed Keras changed them: a scanned encoder would allocate its template block, or draw
    # its stacked weights from the wrong initializers.
    broken = (f"Keras {keras.__version__} changed an internal that "
              "keras_vit.layers.scanned_encoder._unallocated_build relies on: ")
    seeded = keras.initializers.RandomUniform(-1.0, 1.0, seed=7)
    layer = keras.layers.Dense(3, kernel_initializer=seeded)
    try:
        initializers = _unallocated_build(layer, (None, 2))
        unallocated = lambda: [getattr(v, "_value") is None for v in layer.weights]  # noqa: E731
        assert all(unallocated()), broken + "a variable made in StatelessScope(initialize_variables=False) holds a value"
    except (AttributeError, ImportError) as error:
        pytest.fail(broken + repr(error))
    np.testing.assert_array_equal(np.asarray(initializers[0]((2, 3))), np.asarray(seeded((2, 3))),
                                  err_msg=broken + "`variable._initializer` is not the initializer it was made with")
    with keras.StatelessScope():  # closing an initialising scope allocates every variable still waiting
        other = keras.Variable(initializer="ones", shape=(2,))
    assert all(unallocated()), broken + "off the 'uninitialized_variables' list, a variable still gets a value"
    np.testing.assert_array_equal(other.numpy(), 1.0, err_msg=broken + "other waiting variables are no longer initialised")


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
        weight.assign(np.ones(weight.shape) if weight.name == "attention.output_bias" else np.zeros(weight.shape))
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
