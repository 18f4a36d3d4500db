import keras
import numpy as np
import pytest

from keras_vit.layers import PatchDropout
from keras_vit.layers.patch_dropout import num_kept
from tests.layer_checks import check_layer

# 4 examples of 2 prefix tokens and 16 patches; each token's features say (example, place).
PREFIX, PATCHES = 2, 16
TOKENS = np.stack([np.stack([np.full(3, 100.0 * b + t) for t in range(PREFIX + PATCHES)]) for b in range(4)])
TOKENS = TOKENS.astype("float32")


def test_the_count_is_timms():
    # max(1, int(N (1 - rate))): 196 patches of B/16 at 224 px, and at least one.
    assert [num_kept(196, rate) for rate in (0.0, 0.25, 0.5, 0.75)] == [196, 147, 98, 49]
    assert (num_kept(16, 0.3), num_kept(3, 0.9)) == (11, 1)


def test_training_keeps_the_prefix_and_a_fixed_count_of_patches_in_their_order():
    kept, places = PatchDropout(0.3, PREFIX, return_indices=True, seed=1)(TOKENS, training=True)
    kept, places = keras.ops.convert_to_numpy(kept), keras.ops.convert_to_numpy(places)
    assert kept.shape == (4, PREFIX + 11, 3) and places.shape == (4, PREFIX + 11)
    np.testing.assert_array_equal(places[:, :PREFIX], [[0, 1]] * 4)
    patches = places[:, PREFIX:]
    assert (np.diff(patches, axis=1) > 0).all() and patches.min() >= PREFIX and patches.max() < PREFIX + PATCHES
    # The tokens returned are the input's at those places, prefix included.
    np.testing.assert_array_equal(kept, np.take_along_axis(TOKENS, places[:, :, None], axis=1))
    assert len({tuple(row) for row in patches}) > 1  # each example draws its own subset


def test_at_inference_the_input_comes_back():
    layer = PatchDropout(0.5, PREFIX, return_indices=True, seed=1)
    for training in (False, None):
        tokens, places = layer(TOKENS, training=training)
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(tokens), TOKENS)
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(places), [np.arange(PREFIX + PATCHES)] * 4)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(PatchDropout(0.5, PREFIX)(TOKENS)), TOKENS)


def test_the_draws_follow_the_seed_generators_state():
    layer = PatchDropout(0.5, PREFIX, seed=3)
    assert layer.seed_generator.state in layer.variables  # what checkpoints hold, so a resumed run repeats
    state = keras.ops.convert_to_numpy(layer.seed_generator.state.value).copy()
    first, second = (keras.ops.convert_to_numpy(layer(TOKENS, training=True)) for _ in range(2))
    assert not np.array_equal(first, second)
    layer.seed_generator.state.assign(state)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(layer(TOKENS, training=True)), first)


def test_config_and_keras_file_round_trip(tmp_path):
    layer = PatchDropout(0.25, num_prefix_tokens=PREFIX, return_indices=True, seed=7, name="patch_dropout")
    assert layer.get_config()["rate"] == 0.25 and layer.get_config()["return_indices"]
    check_layer(PatchDropout(0.25, num_prefix_tokens=PREFIX, seed=7), tmp_path, TOKENS)
    clone = PatchDropout.from_config(layer.get_config())
    assert (clone.rate, clone.num_prefix_tokens, clone.return_indices, clone.seed) == (0.25, PREFIX, True, 7)


@pytest.mark.parametrize("arguments, message", [
    (dict(rate=1.0), r"`rate` must be a float in \[0.0, 1\); received rate=1.0"),
    (dict(rate=-0.1), r"`rate` must be a float in \[0.0, 1\); received rate=-0.1"),
    (dict(num_prefix_tokens=-1), r"`num_prefix_tokens` must be an int >= 0; received num_prefix_tokens=-1"),
    (dict(return_indices=1), r"`return_indices` must be a bool; received return_indices=1"),
])
def test_bad_arguments_are_refused_by_name(arguments, message):
    with pytest.raises(ValueError, match=message):
        PatchDropout(**arguments)


def test_training_refuses_a_sequence_of_unknown_length():
    import tensorflow as tf

    layer = PatchDropout(0.5, PREFIX)
    traced = tf.function(lambda x: layer(x, training=True), input_signature=[tf.TensorSpec((None, None, 3))])
    with pytest.raises(ValueError, match=r"their number known while tracing; received tokens of shape "
                                         r"\(None, None, 3\)"):
        traced.get_concrete_function()
