"""FlexiViT's resampling of the patch-embedding kernel to another patch size.

Beyer et al., "FlexiViT: One Model for All Patch Sizes" (CVPR 2023), Sec. 3.4;
big_vision `models/proj/flexi/vit.py`, timm `resample_patch_embed`. Resizing
a patch `x` (p x p) to p' x p' is a linear map `R`; the new kernel is
`pinv(R^T) @ kernel`, so that when upsampling (p' >= p, where `R^T` has full
row rank) `<R x, new_kernel> == <x, kernel>` for every patch: an image and its
patches resized by `R` give the same tokens. When shrinking, the new kernel is
the least-squares best such kernel.

The resize is separable (one matrix per axis), with half-pixel centres and
antialiasing when shrinking: PyTorch's `F.interpolate(..., antialias=True)`
(timm's default, `"bicubic"`) and `jax.image.resize` (FlexiViT's,
`"bilinear"`). Pure NumPy, in float64.
"""

import numpy as np

from keras_vit.checks import check_choice, to_pair

METHODS = ("bilinear", "bicubic")


def _kernel(method, x):
    """The interpolation filter at distances `x` >= 0: triangle, or the cubic with a = -0.5 (PIL's, PyTorch's)."""
    if method == "bilinear":
        return np.maximum(0.0, 1.0 - x)
    a = -0.5
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x <= 1, near, np.where(x < 2, far, 0.0))


def resize_matrix(in_size, out_size, method="bicubic"):
    """The `(out_size, in_size)` float64 matrix that resizes one axis (half-pixel centres, antialiased)."""
    check_choice(method, METHODS, "method")
    scale = in_size / out_size
    stretch = max(scale, 1.0)  # antialiasing: the filter widens when shrinking, so every input counts
    centre = (np.arange(out_size) + 0.5) * scale
    x = np.abs((np.arange(in_size)[None, :] + 0.5 - centre[:, None]) / stretch)
    weights = _kernel(method, x)
    return weights / weights.sum(axis=1, keepdims=True)


def resample_patch_kernel(kernel, new_patch_size, method="bicubic"):
    """A patch-embedding kernel `(ph, pw, channels, width)` resampled to `new_patch_size`.

    Args:
        kernel: array `(ph, pw, channels, width)` (the `PatchEmbedding` layout,
            the official `embedding/kernel`).
        new_patch_size: int or (height, width).
        method: `"bicubic"` (timm's default) or `"bilinear"` (FlexiViT's):
            the resize whose effect the kernel undoes.

    Returns:
        The kernel `(new_ph, new_pw, channels, width)`, in `kernel`'s dtype.

    Example:
    >>> kernel = np.random.default_rng(0).normal(size=(8, 8, 3, 4))
    >>> resample_patch_kernel(kernel, 12).shape
    (12, 12, 3, 4)
    """
    kernel = np.asarray(kernel)
    if kernel.ndim != 4:
        raise ValueError(f"A patch kernel is (height, width, channels, width); received shape {kernel.shape}")
    new_h, new_w = to_pair(new_patch_size, "new_patch_size")
    old_h, old_w = kernel.shape[:2]
    if (new_h, new_w) == (old_h, old_w):
        return kernel
    # pinv(kron(A, B)) == kron(pinv(A), pinv(B)): one pseudo-inverse per axis.
    rows = np.linalg.pinv(resize_matrix(old_h, new_h, method).T)
    cols = np.linalg.pinv(resize_matrix(old_w, new_w, method).T)
    resampled = np.einsum("ia,jb,abcd->ijcd", rows, cols, kernel.astype(np.float64))
    return resampled.astype(kernel.dtype)
