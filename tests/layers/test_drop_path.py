import numpy as np
import pytest
import tensorflow as tf

from keras_vit.layers import DropPath


def test_inference_is_identity():
    x = np.random.rand(8, 3, 4).astype("float32")
    np.testing.assert_array_equal(np.asarray(DropPath(0.5)(x, training=False)), x)


def test_training_drops_whole_examples_and_rescales():
    out = np.asarray(DropPath(0.25, seed=1)(np.ones((4000, 3, 2), "float32"), training=True))
    per_example = out.reshape(4000, -1)
    # Each example is dropped or kept whole, kept ones scaled by 1 / 0.75.
    assert np.all(np.isclose(per_example, 0.0) | np.isclose(per_example, 1 / 0.75))
    assert (per_example.min(1) == per_example.max(1)).all()
    assert abs((per_example[:, 0] == 0).mean() - 0.25) < 0.03
    assert abs(per_example.mean() - 1.0) < 0.05


def test_config_and_bad_rate():
    assert DropPath.from_config(DropPath(0.1, seed=3).get_config()).get_config()["rate"] == 0.1
    with pytest.raises(ValueError, match="received rate=1.0"):
        DropPath(1.0)


def test_a_rate_per_call_replaces_the_layers():
    layer = DropPath(0.5, seed=2)
    ones = np.ones((4000, 2), "float32")
    np.testing.assert_array_equal(np.asarray(layer(ones, training=True, rate=0.0)), ones)
    out = np.asarray(layer(ones, training=True, rate=tf.constant(0.1)))[:, 0]
    assert np.all(np.isclose(out, 0.0) | np.isclose(out, 1 / 0.9))
    assert abs((out == 0).mean() - 0.1) < 0.03
    with pytest.raises(ValueError, match=r"DropPath\(rate=0\) draws no random numbers.*received rate=0.5"):
        DropPath(0.0)(ones, training=True, rate=0.5)


def test_a_bfloat16_rate_per_call_under_mixed_precision():
    """ScannedEncoder passes each block's rate in the activations' dtype (a float32 mask once met bfloat16)."""
    layer = DropPath(0.5, seed=1, dtype="mixed_bfloat16")
    inputs = tf.ones((64, 3), tf.bfloat16)
    out = layer(inputs, training=True, rate=tf.constant(0.5, tf.bfloat16)).numpy().astype(np.float32)
    assert out.dtype == np.float32 and set(np.unique(out)) <= {0.0, 2.0} and 0 < (out == 0).mean() < 1
