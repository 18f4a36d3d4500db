"""Request images to model inputs, inside the exported graph, safely.

A served model meets whatever bytes a client sends. Each element is checked
from its header before it is decoded: `keras_vit.image_formats` reads the
header (for the trainer and `keras_vit.explain` too), and this request graph
asserts on it, so a bad element is an InvalidArgument that names its index
and what is wrong, and a decompression bomb (a small file declaring a huge
image) is refused before any pixel is allocated.
Elements are decoded one at a time, so a request's memory is bounded by one
image of `max_image_pixels` plus the batch at the model's resolution; with a
centre crop, the image resized before the crop is held to `max_image_pixels`
too.
"""

import dataclasses

import numpy as np
import tensorflow as tf

from export.choices import DEFAULT_MAX_IMAGE_PIXELS
from keras_vit import image_formats
from keras_vit.image_formats import FORMATS
from keras_vit.preprocessing import input_config, input_range, resize_pixels, size_before_crop


@dataclasses.dataclass(frozen=True)
class Preprocessing:
    """How raw pixels become model inputs; stored with every export."""

    # Model resolution (height, width) and channels.
    image_size: tuple
    channels: int
    # Fraction of the short side kept by the centre crop (1.0: resize the whole image).
    crop_fraction: float = 1.0
    # Resize filter.
    interpolation: str = "bilinear"
    # Pixels p in [0, 255] become (p / 255 - mean) / std, per channel (or one value for all):
    # [-1, 1] for the official checkpoints; the model's `vit_config.input_mean/std`.
    mean: tuple = (0.5,)
    std: tuple = (0.5,)
    # What the model's inputs span, from mean and std: (-1, 1) for the official 0.5 and 0.5.
    input_range: tuple = dataclasses.field(init=False)
    # Largest width x height an encoded image may declare in its header.
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS

    def __post_init__(self):
        object.__setattr__(self, "input_range", input_range(self.mean, self.std))
        if not 0.0 < self.crop_fraction <= 1.0:
            raise ValueError(f"crop_fraction must be in (0, 1]; received {self.crop_fraction}")
        if not (isinstance(self.max_image_pixels, int) and self.max_image_pixels >= 1):
            raise ValueError(f"max_image_pixels must be an integer >= 1; received {self.max_image_pixels!r}")

    @classmethod
    def for_model(cls, model, crop_fraction=1.0, max_image_pixels=DEFAULT_MAX_IMAGE_PIXELS):
        config = input_config(model)  # the model's ViTConfig, or the library's rule for a model without one
        return cls(config.image_size, config.channels, crop_fraction, mean=config.input_mean,
                   std=config.input_std, max_image_pixels=max_image_pixels)


def decode(index, data, preprocessing):
    """One encoded image -> model input, after its header passed the checks."""
    header = image_formats.header(data)
    kind = image_formats.image_format(header)
    known = tf.debugging.Assert(kind >= 0, [
        "images element", index, f"is not a {FORMATS} image (first bytes:", tf.strings.substr(data, 0, 8),
        "length:", tf.strings.length(data), ")"])
    still = tf.debugging.Assert(tf.logical_not(image_formats.is_animated_webp(header, kind)), [
        "images element", index, "is an animated WebP; send one frame (as a still WebP, PNG or JPEG)"])
    with tf.control_dependencies([known, still]):
        pixels = image_formats.declared_pixels(data, header, tf.maximum(kind, 0))
    small = tf.debugging.Assert(tf.logical_and(pixels >= 1, pixels <= preprocessing.max_image_pixels), [
        "images element", index, "declares", pixels, "pixels; this model accepts 1 to",
        preprocessing.max_image_pixels, "(max_image_pixels)"])
    with tf.control_dependencies([small]):
        image = image_formats.decode(data, preprocessing.channels)
    return to_inputs(image, preprocessing)


def to_inputs(pixels, preprocessing):
    """One [h, w, C] image in 0-255 -> model size, centre-cropped, scaled to the model's range."""
    p = preprocessing
    if p.crop_fraction < 1.0:  # resized before the crop, a thin strip would grow by its length: bounded too
        before_crop = size_before_crop(tf.shape(pixels)[:2], p.image_size, p.crop_fraction)
        bounded = tf.debugging.Assert(tf.reduce_prod(before_crop) <= p.max_image_pixels, [
            "an image of (height, width)", tf.shape(pixels)[:2], "would be resized to", before_crop,
            f"before its centre crop (crop_fraction {p.crop_fraction}): more pixels than this model accepts,",
            p.max_image_pixels, "(max_image_pixels)"])
        with tf.control_dependencies([bounded]):
            pixels = tf.identity(pixels)
    resized = resize_pixels(pixels, p.image_size, p.crop_fraction, p.interpolation)  # as the trainer evaluates
    return _scale(resized, p)


def _scale(pixels, preprocessing):
    """(pixels / 255 - mean) / std per channel, as a matmul by diag(1 / (255 std)) and a BiasAdd of -mean / std.

    Why not the formula: TensorFlow's CPU kernels broadcast a [C] vector over
    an image several times slower than this (a visible share of a small
    model's request: docs/performance.md), which gives the same values to a rounding.
    """
    channels = preprocessing.channels
    std = np.broadcast_to(np.asarray(preprocessing.std, np.float64), [channels])
    mean = np.broadcast_to(np.asarray(preprocessing.mean, np.float64), [channels])
    rows = tf.matmul(tf.reshape(pixels, [-1, channels]), np.diag(1.0 / (255.0 * std)).astype(np.float32))
    return tf.reshape(tf.nn.bias_add(rows, (-mean / std).astype(np.float32)), tf.shape(pixels))


def _input_spec(preprocessing):
    return tf.TensorSpec([*preprocessing.image_size, preprocessing.channels], tf.float32)


def images_to_inputs(images, preprocessing):
    """[N] encoded images -> [N, H, W, C] model inputs, one image decoded at a time."""
    # One traced decoder for both branches below: the graph holds it once, and it is traced once.
    one = tf.function(lambda index, data: decode(index, data, preprocessing), autograph=False,
                      input_signature=[tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.string)])

    def each():
        indices = tf.range(tf.shape(images)[0])
        return tf.map_fn(lambda args: one(*args), (indices, images),
                         fn_output_signature=_input_spec(preprocessing), parallel_iterations=1)

    # The loop's set-up costs a sizeable share of a JPEG's decode: a request of one image, the commonest, skips it.
    return tf.cond(tf.equal(tf.shape(images)[0], 1), lambda: one(0, images[0])[None], each)


def pixels_to_inputs(pixels, preprocessing):
    """[N, h, w, C] uint8 pixels -> [N, H, W, C] model inputs."""
    return tf.map_fn(lambda image: to_inputs(image, preprocessing), pixels,
                     fn_output_signature=_input_spec(preprocessing), parallel_iterations=1)


def read_images(paths, preprocessing):
    """Image files -> model inputs (numpy), through the same checks and decoding as a request.

    Raises ValueError naming the first file those refuse, and why.
    """
    one = tf.function(lambda data: images_to_inputs(data[None], preprocessing))  # traced once for every file
    inputs = []
    for path in paths:
        try:
            inputs.append(one(tf.io.read_file(str(path))).numpy())
        except tf.errors.InvalidArgumentError as error:
            reason = error.message.split("\n")[0].replace("assertion failed: ", "")
            raise ValueError(f"The image file {path} cannot be read as a request would be: {reason}") from None
    return np.concatenate(inputs)

