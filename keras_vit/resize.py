"""Resampling of 2-D (and 1-D) grids of embeddings as a linear map.

Position tables are resized one axis at a time by an interpolation matrix
(`out_size x in_size`), so the same code serves load-time resizing of a
checkpoint and in-graph resizing for `dynamic_image_size` models: the matrix
is built from `keras.ops`, works when `out_size` is only known at run time
(XLA sees it as a compile-time constant) and is exact where sizes agree.

Methods:
- "bilinear": linear interpolation with corners aligned, what
  `scipy.ndimage.zoom(order=1)` computes and what the official
  google-research/vision_transformer code uses to resize `pos_embedding`.
- "bicubic": PyTorch's `F.interpolate(mode="bicubic", align_corners=False,
  antialias=True)` (cubic convolution, a=-0.5, stretched when shrinking), what
  timm's `resample_abs_pos_embed` computes, offered for users who want to
  match timm.
- "bicubic_no_antialias": PyTorch's `F.interpolate(mode="bicubic",
  align_corners=False)` without antialiasing (a=-0.75, border samples
  repeated, never stretched), what transformers' `interpolate_pos_encoding`
  computes for ViT, DeiT, DINOv2, CLIP and SigLIP. It differs from "bicubic"
  even when enlarging (by up to a third of a table's spread).
"""

from keras import ops

INTERPOLATIONS = ("bilinear", "bicubic", "bicubic_no_antialias")


def interpolation_matrix(in_size, out_size, method="bilinear", dtype="float32"):
    """Returns the `(out_size, in_size)` matrix that resamples one axis.

    Args:
        in_size: int. Static length of the axis being resampled.
        out_size: int or scalar tensor. Length after resampling.
        method: str. `"bilinear"` (corner-aligned), `"bicubic"` or
            `"bicubic_no_antialias"`.
        dtype: str. Dtype of the matrix; use float64 for load-time resizing.

    Returns:
        A `(out_size, in_size)` tensor `M` with `resized = M @ values`.
    """
    if method not in INTERPOLATIONS:
        raise ValueError(
            f"`method` must be one of {INTERPOLATIONS}; received method={method!r}"
        )
    in_size = int(in_size)
    out = ops.cast(out_size, dtype)
    positions = ops.arange(out_size, dtype=dtype)
    if method == "bilinear":
        # Output sample o sits at o * (in - 1) / (out - 1): first and last
        # samples land exactly on the first and last inputs (aligned corners).
        scale = (in_size - 1) / ops.maximum(out - 1, 1)
        source = positions * scale
        low = ops.clip(ops.floor(source), 0, in_size - 1)
        frac = source - low
        low = ops.cast(low, "int32")
        high = ops.minimum(low + 1, in_size - 1)
        return (1 - frac)[:, None] * ops.one_hot(low, in_size, dtype=dtype) + frac[
            :, None
        ] * ops.one_hot(high, in_size, dtype=dtype)
    if method == "bicubic_no_antialias":
        return _keys_cubic_matrix(in_size, out, positions, dtype)
    # Bicubic as timm resamples position tables: PyTorch's antialiased bicubic
    # (`F.interpolate(..., antialias=True)`, timm's default since 0.9). Output o
    # is centred on input coordinate (o + 0.5) * in / out; its weights are the
    # cubic kernel with a = -0.5, stretched by in / out when shrinking (so every
    # input contributes), over the inputs that exist, normalised to sum to 1.
    scale = in_size / out
    stretch = ops.maximum(scale, 1.0)
    centre = (positions + 0.5) * scale
    x = ops.abs((ops.arange(in_size, dtype=dtype)[None, :] + 0.5 - centre[:, None]) / stretch)
    a = -0.5
    near = ((a + 2) * x - (a + 3)) * x * x + 1  # |x| <= 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a  # 1 < |x| < 2
    weights = ops.where(x <= 1, near, ops.where(x < 2, far, ops.zeros_like(x)))
    return weights / ops.sum(weights, axis=1, keepdims=True)


def _keys_cubic_matrix(in_size, out, positions, dtype):
    """PyTorch's plain bicubic: output o samples input coordinate (o + 0.5) * in / out - 0.5 from its four
    neighbours with Keys' cubic kernel (a = -0.75), indices beyond the ends clamped to them."""
    source = (positions + 0.5) * (in_size / out) - 0.5
    floor = ops.floor(source)
    t = source - floor
    a = -0.75

    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    matrix = 0.0
    for offset, weight in ((-1, far(t + 1)), (0, near(t)), (1, near(1 - t)), (2, far(2 - t))):
        index = ops.cast(ops.clip(floor + offset, 0, in_size - 1), "int32")
        matrix = matrix + weight[:, None] * ops.one_hot(index, in_size, dtype=dtype)
    return matrix


def resize_grid(grid, new_shape, method="bilinear"):
    """Resizes a `(rows, cols, ...)` grid to `(new_rows, new_cols, ...)`.

    Args:
        grid: tensor of shape `(rows, cols, ...)` with static `rows`, `cols`.
        new_shape: pair of ints or scalar tensors, the new `(rows, cols)`.
        method: str. One of `INTERPOLATIONS`.

    Returns:
        The resized grid, in the dtype of `grid`.
    """
    rows, cols = grid.shape[0], grid.shape[1]
    dtype = _matrix_dtype(grid)
    row_matrix = interpolation_matrix(rows, new_shape[0], method, dtype)
    col_matrix = interpolation_matrix(cols, new_shape[1], method, dtype)
    resized = ops.einsum("ri,ij...,cj->rc...", row_matrix, ops.cast(grid, dtype), col_matrix)
    return ops.cast(resized, grid.dtype)


def resize_sequence(table, new_length, method="bilinear"):
    """Resizes a `(length, ...)` table along its first axis, in the dtype of `table`."""
    dtype = _matrix_dtype(table)
    matrix = interpolation_matrix(table.shape[0], new_length, method, dtype)
    return ops.cast(ops.einsum("oi,i...->o...", matrix, ops.cast(table, dtype)), table.dtype)


def _matrix_dtype(table):
    # At least float32: under mixed precision a layer's table comes in bfloat16 or float16, where the
    # sample positions would be off by a tenth of a row and 513 is not a number (bf16 rounds it to 512).
    return "float64" if ops.dtype(table) == "float64" else "float32"
