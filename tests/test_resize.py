from pathlib import Path

import keras
import numpy as np
import pytest
from scipy import ndimage

from keras_vit.resize import interpolation_matrix, resize_grid, resize_sequence

GRID = np.random.default_rng(0).normal(size=(4, 5, 3))


@pytest.mark.parametrize("shape", [(6, 7), (3, 2), (1, 9), (7, 7), (4, 5)])
def test_bilinear_is_scipy_zoom_order_1(shape):
    # The official code resizes pos_embedding with scipy.ndimage.zoom(order=1).
    expected = ndimage.zoom(GRID, (shape[0] / 4, shape[1] / 5, 1), order=1)
    np.testing.assert_allclose(np.asarray(resize_grid(GRID, shape)), expected, atol=1e-12)


@pytest.mark.parametrize("method", ["bilinear", "bicubic", "bicubic_no_antialias"])
def test_same_size_is_exactly_the_identity(method):
    grid = GRID.astype("float32")
    np.testing.assert_array_equal(np.asarray(resize_grid(grid, (4, 5), method)), grid)


@pytest.mark.parametrize("in_size, out_size", [(4, 8), (8, 4)])
def test_bicubic_rows_sum_to_one_and_use_a_minus_0_5(in_size, out_size):
    matrix = np.asarray(interpolation_matrix(in_size, out_size, "bicubic", "float64"))
    np.testing.assert_allclose(matrix.sum(1), 1.0, atol=1e-12)
    # Output 1 sits at input coordinate (1 + .5) * in / out - .5; the antialiased kernel (a = -0.5,
    # PyTorch's with antialias=True) is stretched by in / out when shrinking, and every tap here exists.
    a, stretch = -0.5, max(in_size / out_size, 1)

    def cubic(x):
        return np.where(x <= 1, ((a + 2) * x - (a + 3)) * x * x + 1,
                        np.where(x < 2, ((a * x - 5 * a) * x + 8 * a) * x - 4 * a, 0))

    weights = cubic(np.abs(np.arange(in_size) - ((1 + 0.5) * in_size / out_size - 0.5)) / stretch)
    np.testing.assert_allclose(matrix[1], weights / weights.sum(), atol=1e-12)


# PyTorch's F.interpolate(mode="bicubic", align_corners=False) matrices and a table resized by it, written by
# tests/fixtures/make_family_fixtures.py: antialias=True is timm's rule, False transformers'.
TORCH = np.load(Path(__file__).parent / "fixtures" / "families" / "resize_rules.npz")


@pytest.mark.parametrize("method, antialias", [("bicubic", True), ("bicubic_no_antialias", False)])
@pytest.mark.parametrize("out_size", [6, 2])
def test_the_bicubic_rules_are_pytorchs(method, antialias, out_size):
    matrix = np.asarray(interpolation_matrix(4, out_size, method, "float64"))
    np.testing.assert_allclose(matrix, TORCH[f"bicubic_4_to_{out_size}_antialias_{antialias}"], atol=1e-6)
    if out_size == 6:
        table = TORCH["table_4x4"][0].transpose(1, 2, 0)  # (rows, cols, channels)
        resized = np.asarray(resize_grid(table, (6, 6), method)).transpose(2, 0, 1)
        np.testing.assert_allclose(resized, TORCH[f"table_6x6_antialias_{antialias}"][0], atol=1e-6)


def test_dynamic_output_size_inside_a_tf_function():
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([], tf.int32)])
    def resize(n):
        return resize_sequence(tf.constant(GRID[:, 0]), n)

    expected = ndimage.zoom(GRID[:, 0], (7 / 4, 1), order=1)
    np.testing.assert_allclose(resize(tf.constant(7)).numpy(), expected, atol=1e-12)


def test_unknown_method():
    with pytest.raises(ValueError, match="received method='nearest'"):
        interpolation_matrix(3, 4, "nearest")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_half_precision_table_is_resampled_at_float32_positions(dtype):
    # As a layer's table comes under mixed precision: half-precision positions were off by a tenth of a row
    # and bfloat16 has no 513 (the 1-D relative table of a 16x16 grid came out a row short).
    table = np.random.default_rng(0).normal(size=(289, 4)).astype("float32")
    resized = resize_sequence(keras.ops.cast(table, dtype), 513)
    assert tuple(resized.shape) == (513, 4) and keras.ops.dtype(resized) == dtype
    exact = np.asarray(resize_sequence(table, 513))
    half = np.asarray(keras.ops.cast(keras.ops.cast(table, dtype), "float32"))
    budget = 2 * np.abs(np.asarray(keras.ops.cast(keras.ops.cast(exact, dtype), "float32")) - exact).max() + np.abs(
        half - table).max()
    np.testing.assert_allclose(np.asarray(keras.ops.cast(resized, "float32")), exact, atol=budget)
    grid = np.random.default_rng(1).normal(size=(27, 27, 3)).astype("float32")
    resized_grid = np.asarray(keras.ops.cast(resize_grid(keras.ops.cast(grid, dtype), (49, 49)), "float32"))
    np.testing.assert_allclose(resized_grid, np.asarray(resize_grid(grid, (49, 49))), atol=3 * budget)
