"""Input scaling of the official checkpoints: pixels to [-1, 1]."""

import numpy as np
from keras import ops


def preprocess_input(x, data_format=None):
    """Maps pixels in `[0, 255]` to `[-1, 1]`, the official checkpoints' range.

    Args:
        x: numpy array or tensor of pixels in [0, 255], any shape, any real
            or integer dtype.
        data_format: ignored; present for the `keras.applications`
            signature (the scaling is per pixel).

    Returns:
        float32 `x / 127.5 - 1`: a numpy array for numpy input, else a tensor.

    Example:
    >>> preprocess_input(np.array([0, 255], "uint8"))
    array([-1.,  1.], dtype=float32)
    """
    del data_format
    if isinstance(x, (np.ndarray, list, tuple, int, float)):
        return np.asarray(x, np.float32) / np.float32(127.5) - np.float32(1.0)
    return ops.cast(x, "float32") / 127.5 - 1.0
