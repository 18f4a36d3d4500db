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


@pytest.mark.parametrize("method", ["bilinear", "bicubic"])
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
    cubic = lambda x: np.where(x <= 1, ((a + 2) * x - (a + 3)) * x * x + 1,
                               np.where(x < 2, ((a * x - 5 * a) * x + 8 * a) * x - 4 * a, 0))
    weights = cubic(np.abs(np.arange(in_size) - ((1 + 0.5) * in_size / out_size - 0.5)) / stretch)
    np.testing.assert_allclose(matrix[1], weights / weights.sum(), atol=1e-12)


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
