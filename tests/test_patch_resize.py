import os

import numpy as np
import pytest

from keras_vit.patch_resize import resample_patch_kernel, resize_matrix


def _resize_patch(patch, new_size, method):
    """A (h, w, channels) patch resized by the separable matrices."""
    rows, cols = resize_matrix(patch.shape[0], new_size[0], method), resize_matrix(patch.shape[1], new_size[1], method)
    return np.einsum("ia,jb,abc->ijc", rows, cols, patch)


@pytest.mark.parametrize("method", ["bicubic", "bilinear"])
@pytest.mark.parametrize("new_size", [(12, 12), (16, 10), (8, 9)])
def test_upsampled_kernel_gives_the_same_token_on_the_resized_patch(method, new_size):
    # FlexiViT's defining property: <resize(x), new_kernel> == <x, kernel> for every patch x.
    rng = np.random.default_rng(0)
    kernel = rng.normal(size=(8, 8, 3, 5))
    new_kernel = resample_patch_kernel(kernel, new_size, method)
    assert new_kernel.shape == (*new_size, 3, 5)
    for _ in range(3):
        patch = rng.normal(size=(8, 8, 3))
        np.testing.assert_allclose(np.einsum("ijc,ijcd->d", _resize_patch(patch, new_size, method), new_kernel),
                                   np.einsum("ijc,ijcd->d", patch, kernel), atol=1e-9)


def test_downsampling_is_the_least_squares_kernel():
    # Shrinking cannot keep every token; the kernel is the pseudo-inverse's (minimum-norm least squares).
    rng = np.random.default_rng(1)
    kernel = rng.normal(size=(8, 8, 1, 1))
    new_kernel = resample_patch_kernel(kernel, 6)
    matrix = np.kron(resize_matrix(8, 6), resize_matrix(8, 6))  # (36, 64): resizes a flat patch
    expected, *_ = np.linalg.lstsq(matrix.T, kernel.reshape(64), rcond=None)
    np.testing.assert_allclose(new_kernel.reshape(36), expected, atol=1e-10)


def test_resize_matrix_rows_sum_to_one_and_identity_at_same_size():
    for method in ("bicubic", "bilinear"):
        np.testing.assert_allclose(resize_matrix(8, 5, method).sum(1), 1.0)
        np.testing.assert_allclose(resize_matrix(7, 7, method), np.eye(7), atol=1e-12)


def test_same_size_and_dtype():
    kernel = np.ones((4, 4, 3, 2), np.float32)
    assert resample_patch_kernel(kernel, 4) is kernel
    assert resample_patch_kernel(kernel, 6).dtype == np.float32


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"received shape \(4, 4, 3\)"):
        resample_patch_kernel(np.ones((4, 4, 3)), 6)
    with pytest.raises(ValueError, match="`method` must be one of"):
        resample_patch_kernel(np.ones((4, 4, 3, 2)), 6, method="nearest")
    with pytest.raises(ValueError, match="new_patch_size"):
        resample_patch_kernel(np.ones((4, 4, 3, 2)), 0)


FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "timm_extra")


def test_matches_timms_resample_patch_embed():
    # patch_kernels.npz: timm's resample_patch_embed (antialiased) of one kernel, written by make_timm_extra_fixtures.
    with np.load(os.path.join(FIXTURES, "patch_kernels.npz")) as data:
        kernel = data["kernel"]
        for name in ("bicubic_12x12", "bicubic_6x10", "bilinear_12x12", "bilinear_6x10"):
            method, size = name.split("_")
            new_size = tuple(int(s) for s in size.split("x"))
            # timm resamples in float32: agreement to its rounding.
            np.testing.assert_allclose(resample_patch_kernel(kernel, new_size, method), data[name], atol=2e-5)


def test_from_checkpoint_at_another_patch_size_gives_timms_logits():
    # flexi_io.npz: timm's checkpoint_filter_fn loading the patch-8 augreg fixture into a patch-4 model.
    import keras_vit

    with np.load(os.path.join(FIXTURES, "flexi_io.npz")) as io:
        inputs, logits = io["inputs"], io["logits"]
    model = keras_vit.ViT.from_checkpoint(os.path.join(os.path.dirname(FIXTURES), "timm", "augreg"), patch_size=4,
                                          classifier_activation=None)
    assert model.vit_config.patch_size == (4, 4) and model.vit_config.grid_size == (8, 8)
    np.testing.assert_allclose(np.asarray(model(inputs)), logits, atol=1e-4)
