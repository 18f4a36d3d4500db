import numpy as np
import pytest

from keras_vit.layers import PatchEmbedding
from tests.layer_checks import check_layer


def test_standard_checks(tmp_path):
    out = check_layer(PatchEmbedding(patch_size=4, hidden_size=8), tmp_path,
                      np.random.rand(2, 8, 12, 3).astype("float32"))
    assert out.shape == (2, 2, 3, 8)


def test_each_patch_is_a_linear_projection_of_its_pixels():
    layer = PatchEmbedding(patch_size=2, hidden_size=1)
    image = np.arange(16, dtype="float32").reshape(1, 4, 4, 1)
    layer.build(image.shape)
    layer.kernel.assign(np.array([1.0, 10.0, 100.0, 1000.0]).reshape(2, 2, 1, 1))
    layer.bias.assign([0.5])
    out = np.asarray(layer(image))[0, :, :, 0]
    # Top-left patch holds pixels 0, 1 (row 0) and 4, 5 (row 1).
    assert out[0, 0] == 0 * 1 + 1 * 10 + 4 * 100 + 5 * 1000 + 0.5
    assert out[1, 1] == 10 * 1 + 11 * 10 + 14 * 100 + 15 * 1000 + 0.5


def test_patch_size_one_projects_a_feature_map(tmp_path):
    # Hybrids: a CNN feature map (1024 channels) is embedded position by position.
    layer = PatchEmbedding(patch_size=1, hidden_size=16)
    out = np.asarray(layer(np.random.rand(2, 3, 5, 1024).astype("float32")))
    assert out.shape == (2, 3, 5, 16)


def test_integer_input_is_cast_not_rescaled():
    layer = PatchEmbedding(patch_size=2, hidden_size=4)
    pixels = np.random.default_rng(0).integers(0, 256, (1, 4, 4, 3))
    np.testing.assert_allclose(
        np.asarray(layer(pixels.astype("uint8"))), np.asarray(layer(pixels.astype("float32"))))


@pytest.mark.parametrize("shape, message", [
    ((2, 8, 8), "rank 4"),
    ((2, 9, 8, 3), "divisible by `patch_size`"),
])
def test_bad_input_names_expected_and_received(shape, message):
    with pytest.raises(ValueError, match=message) as error:
        PatchEmbedding(patch_size=4, hidden_size=8)(np.zeros(shape, "float32"))
    assert str(shape) in str(error.value)


def test_sizes_known_only_when_run_are_refused_unless_they_divide():
    """dynamic_image_size in a traced function: the convolution alone would drop the remainder silently."""
    import tensorflow as tf

    layer = PatchEmbedding(patch_size=4, hidden_size=8)
    good, bad = (np.random.default_rng(0).uniform(-1, 1, (2, h, w, 3)).astype("float32") for h, w in ((8, 12), (8, 14)))
    for jit_compile in (False, True):
        traced = tf.function(layer, jit_compile=jit_compile, input_signature=[tf.TensorSpec((None, None, None, 3))])
        np.testing.assert_allclose(traced(good), layer(good), atol=1e-6)
        # The graph names the sizes; XLA compiles the assertion away, and the sizes then fail a reshape.
        message = r"divisible by `patch_size`=\(4, 4\); received\] \[8 14\]" if not jit_compile else "reshape"
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            traced(bad)


def test_bad_arguments():
    with pytest.raises(ValueError, match="received patch_size=0"):
        PatchEmbedding(patch_size=0)
    with pytest.raises(ValueError, match="received hidden_size=0"):
        PatchEmbedding(hidden_size=0)


def test_a_projection_without_bias(tmp_path):
    """CLIP's patch projection has no bias: no weight, and the convolution alone."""
    images = np.random.default_rng(1).uniform(-1, 1, (2, 8, 12, 3)).astype("float32")
    out = check_layer(PatchEmbedding(patch_size=4, hidden_size=8, use_bias=False), tmp_path, images)
    layer = PatchEmbedding(patch_size=4, hidden_size=8, use_bias=False)
    layer.build(images.shape)
    assert [v.name for v in layer.weights] == ["kernel"] and out.shape == (2, 2, 3, 8)
    kernel = layer.kernel.numpy()
    patches = images.reshape(2, 2, 4, 3, 4, 3).transpose(0, 1, 3, 2, 4, 5)  # (batch, row, col, ph, pw, channels)
    np.testing.assert_allclose(np.asarray(layer(images)), np.einsum("brcijk,ijkd->brcd", patches, kernel), atol=1e-5)
    with pytest.raises(ValueError, match=r"`use_bias` must be a bool; received use_bias=0"):
        PatchEmbedding(use_bias=0)
