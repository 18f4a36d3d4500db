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


def test_bicubic_rows_sum_to_one_and_use_a_minus_0_75():
    matrix = np.asarray(interpolation_matrix(4, 8, "bicubic", "float64"))
    np.testing.assert_allclose(matrix.sum(1), 1.0, atol=1e-12)
    # Output 3 sits at (3 + .5) * 4 / 8 - .5 = 1.25: taps at 0..3 with t = 0.25,
    # weights of the cubic convolution kernel with a = -0.75 (PyTorch's).
    a, t = -0.75, 0.25
    near = lambda x: ((a + 2) * x - (a + 3)) * x * x + 1
    far = lambda x: ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    np.testing.assert_allclose(matrix[3], [far(1 + t), near(t), near(1 - t), far(2 - t)], atol=1e-12)


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
