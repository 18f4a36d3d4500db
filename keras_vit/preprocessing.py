"""Input scaling: pixels to what the weights expect (the official checkpoints: [-1, 1]), at the model's size."""

import logging
import sys

import keras
import numpy as np
from keras import ops

from keras_vit.config import ViTConfig, output_stride


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
    if numpy_in:
        x = np.asarray(x, np.float32)
    elif _uses_tensorflow(x):  # a tf.data graph's tensor too, whatever Keras' backend (the trainer on JAX)
        x = sys.modules["tensorflow"].cast(x, "float32")
    else:
        x = ops.cast(x, "float32")
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


# How far past `input_range` a model input may lie, as a fraction of its width: room for a bicubic or
# Lanczos resize's overshoot after scaling, none for raw pixels (up to 255) or, for ImageNet's mean and
# std ([-2.1, 2.6]), for pixels scaled to [0, 255].
RANGE_MARGIN = 0.25
# A whole batch inside this fraction of the range looks scaled twice: [-1, 1] scaled again is [-1.008, -0.992].
TWICE_SPREAD = 0.03


def check_input_range(x, config, what="inputs"):
    """Raises ValueError when `x` (numpy) is not what `preprocess_input(pixels, config=config)` gives.

    Values past `input_range` by more than RANGE_MARGIN of its width (raw
    pixels) or NaN are refused; a batch whose values all lie within
    TWICE_SPREAD of its width (scaled twice) draws a warning, as a batch of
    one flat colour does the same.
    """
    x = np.asarray(x)
    if not x.size:
        return
    low, high = input_range(config.input_mean, config.input_std)
    margin = RANGE_MARGIN * (high - low)
    least, most = float(np.min(x)), float(np.max(x))
    if np.isnan(least) or np.isnan(most) or least < low - margin or most > high + margin:
        raise ValueError(f"{what} must be model inputs, scaled by `keras_vit.preprocess_input(pixels, "
                         f"config=model.vit_config)` to [{low:.4g}, {high:.4g}]; received values from {least:.4g} to "
                         f"{most:.4g} (raw pixels?). Pass check_input_range=False to run on them anyway.")
    if most - least < TWICE_SPREAD * (high - low):
        logging.getLogger(__name__).warning(
            "%s all lie in [%.4g, %.4g], %.1f%% of the model's input range [%.4g, %.4g]: preprocess_input applied "
            "twice? (one flat colour looks the same; check_input_range=False silences this)",
            what, least, most, 100 * (most - least) / (high - low), low, high)


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

    On Keras' TensorFlow backend, and for a `tf.Tensor` (a `tf.data` graph's),
    `tf.image.resize` does it; on JAX and PyTorch `keras.ops.image.resize`,
    without TensorFlow (tests/backends: within one level of TensorFlow's
    pixels once rounded).

    Args:
        image: `(h, w, C)` tensor of pixels, any real or integer dtype.
        size: `(height, width)` of the result.
        crop_fraction: float in (0, 1]. Defaults to 1.0.
        interpolation: a `tf.image.resize` method; off TensorFlow, one of
            `keras.ops.image.resize`'s on the backend (bilinear, bicubic and
            nearest everywhere). Defaults to "bilinear".

    Returns:
        float32 `(height, width, C)` pixels in the input's range.

    Example:
    >>> image = np.zeros((300, 400, 3), "uint8")
    >>> tuple(resize_and_center_crop(image, (224, 224), 0.875).shape)
    (224, 224, 3)
    """
    if not _uses_tensorflow(image):
        return _resize_and_center_crop_keras(image, size, crop_fraction, interpolation)
    import tensorflow as tf  # here, not above: the model and `preprocess_input` run without TensorFlow

    height, width = size
    if crop_fraction < 1.0:
        resized = tf.cast(size_before_crop(tf.shape(image)[:2], size, crop_fraction), tf.int32)
        image = tf.image.resize(image, resized, method=interpolation)
        return tf.image.resize_with_crop_or_pad(image, height, width)
    return tf.image.resize(image, (height, width), method=interpolation)


def _uses_tensorflow(image):
    """Whether TensorFlow's ops resize `image`: on its backend, or for its tensors (a `tf.data` graph's)."""
    if keras.backend.backend() == "tensorflow":
        return True
    tf = sys.modules.get("tensorflow")  # never imported here: None when TensorFlow is absent or not yet in use
    return tf is not None and hasattr(tf, "is_tensor") and tf.is_tensor(image)


def _resize_and_center_crop_keras(image, size, crop_fraction, interpolation):
    """`resize_and_center_crop` in `keras.ops`, on eager arrays: TensorFlow's sizes and crop offsets."""
    image = ops.cast(ops.convert_to_tensor(image), "float32")
    if len(image.shape) != 3:
        raise ValueError(f"`image` must be one (height, width, channels) image; received shape {tuple(image.shape)}")
    height, width = size
    if crop_fraction >= 1.0:
        return _resize_keras(image, (height, width), interpolation)
    resized = [int(side) for side in size_before_crop(image.shape[:2], size, crop_fraction)]
    image = _resize_keras(image, resized, interpolation)
    # `tf.image.resize_with_crop_or_pad`'s offsets; the short side is max(size) / crop_fraction >= max(size)
    # rounded, so both sides are at least `size` and nothing is padded.
    top, left = (resized[0] - height) // 2, (resized[1] - width) // 2
    return image[top: top + height, left: left + width]


def _resize_keras(image, size, interpolation):
    """float32 `image` resized to `size` in `keras.ops`: bicubic as TensorFlow's, the rest by `ops.image.resize`."""
    if interpolation != "bicubic":
        return ops.image.resize(image, tuple(size), interpolation=interpolation, data_format="channels_last")
    # PyTorch's bicubic (a = -0.75, edge pixels repeated) is up to 27 levels from TensorFlow's: TensorFlow's
    # kernel as two matrices instead, the same on every backend.
    rows = _bicubic_matrix(image.shape[0], size[0])
    columns = _bicubic_matrix(image.shape[1], size[1])
    return ops.einsum("pw,owc->opc", columns, ops.einsum("oh,hwc->owc", rows, image))


# TensorFlow's bicubic filter (resize_bicubic_op.cc with half-pixel centres): Keys' cubic with a = -0.5, read
# from a table of KEYS_TABLE_SIZE steps per pixel.
KEYS_A = np.float32(-0.5)
KEYS_TABLE_SIZE = 1024


def _bicubic_matrix(size_in, size_out):
    """float32 `(size_out, size_in)`: the weights of TensorFlow's half-pixel bicubic resize along one axis.

    Taps outside the image get no weight, and the others are rescaled to
    sum to one, as TensorFlow's kernel does for Keys' cubic.
    """
    step = np.arange(KEYS_TABLE_SIZE + 1, dtype=np.float32) / np.float32(KEYS_TABLE_SIZE)
    near = ((KEYS_A + 2) * step - (KEYS_A + 3)) * step * step + 1  # |distance| = step, in [0, 1]
    far_step = step + 1
    far = ((KEYS_A * far_step - 5 * KEYS_A) * far_step + 8 * KEYS_A) * far_step - 4 * KEYS_A  # 1 + step
    position = (np.arange(size_out, dtype=np.float32) + np.float32(0.5)) * np.float32(size_in / size_out) - 0.5
    start = np.floor(position)
    offset = np.rint((position - start) * np.float32(KEYS_TABLE_SIZE)).astype(np.int64)
    taps = start.astype(np.int64)[:, None] + np.arange(-1, 3)
    weights = np.stack([far[offset], near[offset], near[KEYS_TABLE_SIZE - offset], far[KEYS_TABLE_SIZE - offset]], 1)
    weights = np.where((taps >= 0) & (taps < size_in), weights, np.float32(0))
    weights = weights / np.sum(weights, 1, keepdims=True)
    matrix = np.zeros((size_out, size_in), np.float32)
    np.add.at(matrix, (np.repeat(np.arange(size_out), 4), np.clip(taps, 0, size_in - 1).ravel()), weights.ravel())
    return matrix


def size_before_crop(shape, size, crop_fraction):
    """float32 `(height, width)` that `resize_and_center_crop` resizes an image of `shape` to before cropping.

    Its short side becomes `max(size) / crop_fraction`: a thin strip grows
    along its length by the same factor. A tensor `shape` (`tf.shape`) gives
    a tensor; a tuple of ints a numpy array, by the same float32 arithmetic.
    """
    tf = sys.modules.get("tensorflow")
    if tf is not None and hasattr(tf, "is_tensor") and tf.is_tensor(shape):
        shape = tf.cast(shape, tf.float32)
        return tf.round(shape * (max(size) / crop_fraction / tf.reduce_min(shape)))
    shape = np.asarray(shape, np.float32)
    return np.round(shape * (np.float32(max(size) / crop_fraction) / np.min(shape)))


def resize_pixels(image, size, crop_fraction=1.0, interpolation="bilinear"):
    """`resize_and_center_crop` of a 0-255 image, rounded to whole pixel values as a resized uint8 image.

    What the trainer evaluates and an export serves, so a served model sees
    the inputs its evaluation saw.
    """
    if not _uses_tensorflow(image):
        resized = ops.round(_resize_and_center_crop_keras(image, size, crop_fraction, interpolation))
        return resized if interpolation in ("bilinear", "area", "nearest") else ops.clip(resized, 0.0, 255.0)
    import tensorflow as tf

    resized = tf.round(resize_and_center_crop(image, size, crop_fraction, interpolation))
    if interpolation in ("bilinear", "area", "nearest"):  # weighted means of the pixels: never outside 0-255
        return resized
    return tf.clip_by_value(resized, 0.0, 255.0)


def native_image_size(model):
    """`(height, width)` a keras_vit model was built for, also when it takes any size (`dynamic_image_size`).

    Its input shape, or else its patch grid times the patch embedding's
    stride (behind a hybrid's ResNet stem, that stem's too).
    """
    _, height, width, _ = model.input_shape
    if height is not None and width is not None:
        return (height, width)
    grid = model.get_layer("position_embedding").grid_size
    stride = model.get_layer("patch_embedding").patch_size
    if any(layer.name == "resnet_stem" for layer in model.layers):
        factor = output_stride(model.get_layer("resnet_stem").num_layers)
        stride = (stride[0] * factor, stride[1] * factor)
    return (grid[0] * stride[0], grid[1] * stride[1])


def input_config(model):
    """The `ViTConfig` whose image size, channels, mean and std prepare `model`'s inputs.

    A keras_vit model's own `vit_config`; for a model without one (a
    `keras.Model` made of a ViT's layers, say), its native image size and
    the official [-1, 1] scaling.
    """
    config = getattr(model, "vit_config", None)
    if config is not None:
        return config
    size, channels = native_image_size(model), model.input_shape[-1]
    logging.warning("The model %r carries no ViTConfig: its inputs are taken as %s px scaled to [-1, 1]",
                    model.name, size)
    return ViTConfig(image_size=size, patch_size=size, channels=channels,
                     input_mean=(0.5,) * channels, input_std=(0.5,) * channels)
