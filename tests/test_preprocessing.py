import numpy as np
import tensorflow as tf

from keras_vit import preprocess_input


def test_maps_uint8_pixels_to_minus_one_one():
    out = preprocess_input(np.array([0, 127.5, 255]).astype("float32"))
    np.testing.assert_allclose(out, [-1.0, 0.0, 1.0])
    out = preprocess_input(np.array([[0, 255]], "uint8"))
    assert out.dtype == np.float32 and out.tolist() == [[-1.0, 1.0]]


def test_tensors_stay_tensors():
    out = preprocess_input(tf.constant([0, 255], tf.uint8))
    assert isinstance(out, tf.Tensor) and out.numpy().tolist() == [-1.0, 1.0]
