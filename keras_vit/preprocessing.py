"""Input scaling: pixels to what the weights expect (the official checkpoints: [-1, 1])."""

import numpy as np
from keras import ops


def preprocess_input(x, data_format=None, config=None):
    """Maps pixels in `[0, 255]` to the model's input: `(x / 255 - mean) / std`.

    Args:
        x: numpy array or tensor of pixels in [0, 255], `(..., channels)`,
            any real or integer dtype.
        data_format: `"channels_last"` (the default: the models take
            channels last) or `"channels_first"`, where the channels of a
            per-channel mean and std are taken, as in `keras.applications`.
        config: optional `keras_vit.ViTConfig` (e.g. `model.vit_config`)
            whose `input_mean` and `input_std` to use; without it, the
            official 0.5 and 0.5, i.e. `x / 127.5 - 1`, in [-1, 1].

    Returns:
        float32: a numpy array for numpy input, else a tensor.

    Example:
    >>> preprocess_input(np.array([0, 255], "uint8"))
    array([-1.,  1.], dtype=float32)
    """
    if data_format not in (None, "channels_last", "channels_first"):
        raise ValueError(f"`data_format` must be 'channels_last' or 'channels_first'; received {data_format!r}")
    numpy_in = isinstance(x, (np.ndarray, list, tuple, int, float))
    x = np.asarray(x, np.float32) if numpy_in else ops.cast(x, "float32")
    if config is None or set(config.input_mean) == set(config.input_std) == {0.5}:
        return x / np.float32(127.5) - np.float32(1.0)
    mean = np.asarray(config.input_mean, np.float32) * np.float32(255.0)
    std = np.asarray(config.input_std, np.float32) * np.float32(255.0)
    axis = -3 if data_format == "channels_first" else -1
    if len(mean) > 1:  # per channel: the channels must be the mean's, not broadcast into them
        channels = x.shape[axis] if len(x.shape) >= -axis else 0
        if channels is not None and channels != len(mean):  # None: known only when a traced function runs
            raise ValueError(f"The config's mean and std are per channel ({len(mean)}); received images of shape "
                             f"{tuple(x.shape)} with {channels} channels on axis {axis} "
                             f"({data_format or 'channels_last'})")
        if axis == -3:
            mean, std = mean[:, None, None], std[:, None, None]
    return (x - mean) / std


def input_range(mean=(0.5,), std=(0.5,)):
    """`(low, high)`: the bounds of `preprocess_input` over pixels in [0, 255], across the channels.

    Example:
    >>> input_range(), input_range((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    ((-1.0, 1.0), (-2.1179039301310043, 2.6399999999999997))
    """
    mean, std = np.asarray(mean, np.float64), np.asarray(std, np.float64)
    return float(np.min(-mean / std)), float(np.max((1.0 - mean) / std))


def inputs_to_pixels(x, config):
    """The inverse of `preprocess_input(x, config=config)`: model inputs back to float32 pixels in [0, 255].

    Example:
    >>> from keras_vit import ViTConfig
    >>> np.asarray(inputs_to_pixels(np.array([-1.0, 1.0], "float32"), ViTConfig(channels=1, input_mean=(0.5,),
    ...                                                                          input_std=(0.5,))))
    array([  0., 255.], dtype=float32)
    """
    return (ops.cast(x, "float32") * np.asarray(config.input_std, np.float32)
            + np.asarray(config.input_mean, np.float32)) * np.float32(255.0)


def resize_and_center_crop(image, size, crop_fraction=1.0, interpolation="bilinear"):
    """Resizes one `(h, w, C)` image to `size`, keeping `crop_fraction` of its centre.

    With `crop_fraction < 1` the short side is first scaled to
    `max(size) / crop_fraction` (aspect kept), then the centre `size` is cut
    out: the evaluation crop of Inception, DeiT and the official code
    (0.875). With 1.0 the whole image is resized to `size`.

    Args:
        image: `(h, w, C)` tensor of pixels, any real or integer dtype.
        size: `(height, width)` of the result.
        crop_fraction: float in (0, 1]. Defaults to 1.0.
        interpolation: a `tf.image.resize` method. Defaults to "bilinear".

    Returns:
        float32 `(height, width, C)` pixels in the input's range.

    Example:
    >>> image = np.zeros((300, 400, 3), "uint8")
    >>> tuple(resize_and_center_crop(image, (224, 224), 0.875).shape)
    (224, 224, 3)
    """
    import tensorflow as tf  # here, not above: the model and `preprocess_input` run without TensorFlow

    height, width = size
    if crop_fraction < 1.0:
        resized = tf.cast(size_before_crop(tf.shape(image)[:2], size, crop_fraction), tf.int32)
        image = tf.image.resize(image, resized, method=interpolation)
        return tf.image.resize_with_crop_or_pad(image, height, width)
    return tf.image.resize(image, (height, width), method=interpolation)


def size_before_crop(shape, size, crop_fraction):
    """float32 `(height, width)` that `resize_and_center_crop` resizes an image of `shape` to before cropping.

    Its short side becomes `max(size) / crop_fraction`: a thin strip grows
    along its length by the same factor.
    """
    import tensorflow as tf

    shape = tf.cast(shape, tf.float32)
    return tf.round(shape * (max(size) / crop_fraction / tf.reduce_min(shape)))


def resize_pixels(image, size, crop_fraction=1.0, interpolation="bilinear"):
    """`resize_and_center_crop` of a 0-255 image, rounded to whole pixel values as a resized uint8 image.

    What the trainer evaluates and an export serves, so a served model sees
    the inputs its evaluation saw.
    """
    import tensorflow as tf

    resized = tf.round(resize_and_center_crop(image, size, crop_fraction, interpolation))
    if interpolation in ("bilinear", "area", "nearest"):  # weighted means of the pixels: never outside 0-255
        return resized
    return tf.clip_by_value(resized, 0.0, 255.0)
