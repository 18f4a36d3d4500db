import numpy as np
import tensorflow as tf

from keras_vit.layers import ResidualUnit, ResNetStem, StdConv2D
from tests.layer_checks import check_layer, randomize_weights

IMAGES = np.random.default_rng(0).normal(size=(2, 17, 23, 3)).astype("float32")


def test_standard_checks(tmp_path):
    assert check_layer(StdConv2D(8, 3, strides=2), tmp_path, IMAGES).shape == (2, 9, 12, 8)
    features = np.random.default_rng(1).normal(size=(2, 5, 6, 32)).astype("float32")
    assert check_layer(ResidualUnit(32, strides=2), tmp_path, features, randomize=True).shape == (2, 3, 3, 128)


def test_stem_round_trips(tmp_path):
    stem = ResNetStem((1, 1), width_factor=0.5)
    assert check_layer(stem, tmp_path, IMAGES, randomize=True).shape == (2, 3, 3, 256)


def test_kernel_is_standardised_as_the_official_std_conv():
    layer = StdConv2D(4, 3, strides=2)
    layer.build(IMAGES.shape)
    randomize_weights(layer, scale=2.0)
    w = layer.kernel.numpy().astype(np.float64)
    mean = w.mean(axis=(0, 1, 2), keepdims=True)
    standardised = (w - mean) / (w.std(axis=(0, 1, 2), keepdims=True) + 1e-5)
    expected = tf.nn.conv2d(IMAGES, standardised.astype("float32"), strides=2, padding="SAME")
    np.testing.assert_allclose(np.asarray(layer(IMAGES)), expected.numpy(), atol=1e-4)


def test_same_padding_and_output_stride():
    # 17 x 23 -> conv/2 -> 9 x 12 -> max-pool/2 -> 5 x 6 -> stage 2 /2 -> 3 x 3
    assert tuple(ResNetStem((1, 1), 0.5)(IMAGES).shape) == (2, 3, 3, 256)
    assert tuple(ResNetStem((), 1.0)(IMAGES).shape) == (2, 5, 6, 64)
    stem = ResNetStem((3, 4, 9))
    assert stem.compute_output_shape((None, 224, 224, 3)) == (None, 14, 14, 1024)


def test_units_start_as_their_shortcut_and_project_only_when_needed():
    unit = ResidualUnit(32)
    unit.build((None, 5, 5, 128))
    assert unit.conv_proj is None and not unit.gn3.gamma.numpy().any()
    x = np.abs(np.random.default_rng(2).normal(size=(1, 5, 5, 128))).astype("float32")
    np.testing.assert_allclose(np.asarray(unit(x)), x, atol=1e-6)  # relu(x + 0)
    projected = ResidualUnit(32, strides=2)
    projected.build((None, 5, 5, 128))
    assert projected.conv_proj is not None
