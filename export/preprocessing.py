"""Request images to model inputs, inside the exported graph, safely.

A served model meets whatever bytes a client sends. Each element is checked
from its header before it is decoded, so a bad element is an InvalidArgument
that names its index and what is wrong, and a decompression bomb (a small
file declaring a huge image) is refused before any pixel is allocated.
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
from keras_vit.image_formats import FORMATS, starts_with
from keras_vit.layers.resnet_stem import output_stride
from keras_vit.preprocessing import input_range, resize_pixels, size_before_crop


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
        config = getattr(model, "vit_config", None)
        if config is None:  # a .keras file written before models carried their ViTConfig
            return cls(native_image_size(model), model.input_shape[-1], crop_fraction,
                       max_image_pixels=max_image_pixels)
        return cls(config.image_size, config.channels, crop_fraction, mean=config.input_mean,
                   std=config.input_std, max_image_pixels=max_image_pixels)


def native_image_size(model):
    """(height, width) the model was built for, also when it takes any size (`dynamic_image_size`)."""
    _, height, width, _ = model.input_shape
    if height is not None and width is not None:
        return (height, width)
    grid = model.get_layer("position_embedding").grid_size
    stride = model.get_layer("patch_embedding").patch_size
    if any(layer.name == "resnet_stem" for layer in model.layers):
        factor = output_stride(model.get_layer("resnet_stem").num_layers)
        stride = (stride[0] * factor, stride[1] * factor)
    return (grid[0] * stride[0], grid[1] * stride[1])


def _number(header, start, count, big_endian):
    """An unsigned integer of `count` bytes at `start` of the header."""
    order = range(count) if big_endian else reversed(range(count))
    value = tf.constant(0, tf.int64)
    for k in order:
        value = value * 256 + header[start + k]
    return value


def _declared_pixels(data, header, kind):
    """width x height the image declares (GIF: x the frames' control blocks, at least 1)."""
    def jpeg():
        shape = tf.cast(tf.image.extract_jpeg_shape(data), tf.int64)
        return shape[0] * shape[1]

    def png():
        return _number(header, 16, 4, True) * _number(header, 20, 4, True)

    def gif():
        # The decoder returns the first frame but decodes every frame first, each at the largest
        # frame's size; the screen size in the header need not bound the frames.
        frames, width, height = _gif_frames(data)
        return (tf.maximum(frames, 1) * tf.maximum(width, _number(header, 6, 2, False))
                * tf.maximum(height, _number(header, 8, 2, False)))

    def bmp():
        height = _number(header, 22, 4, False)
        height = tf.where(height >= 2**31, 2**32 - height, height)  # negative: stored top-down
        return _number(header, 18, 4, False) * height

    def webp():
        # The first chunk, at byte 12, says the layout: VP8 (lossy) has 14-bit sizes after its frame tag
        # and start code; VP8L (lossless) 14-bit sizes minus one after its signature byte; VP8X (extended)
        # a 24-bit canvas size minus one (an animation is refused before this, in `decode`).
        lossy = tf.bitwise.bitwise_and(_number(header, 26, 2, False), 0x3FFF) * tf.bitwise.bitwise_and(
            _number(header, 28, 2, False), 0x3FFF)
        bits = _number(header, 21, 4, False)
        lossless = (tf.bitwise.bitwise_and(bits, 0x3FFF) + 1) * (tf.bitwise.bitwise_and(
            tf.bitwise.right_shift(bits, 14), 0x3FFF) + 1)
        extended = (_number(header, 24, 3, False) + 1) * (_number(header, 27, 3, False) + 1)
        return tf.where(starts_with(header, b"VP8 ", 12), lossy, tf.where(
            starts_with(header, b"VP8L", 12), lossless, tf.where(starts_with(header, b"VP8X", 12), extended, 0)))

    return tf.switch_case(kind, [jpeg, png, gif, bmp, webp])  # in `image_formats` order


def _gif_frames(data):
    """`(frames, largest width, largest height)` of a GIF's image descriptors, found by walking its blocks.

    Header and screen descriptor, the colour table, then blocks: an extension
    (0x21, label, data sub-blocks), an image (0x2C, its descriptor, a colour
    table, LZW code size, data sub-blocks) or the end (0x3B). A sub-block is
    a length byte and that many bytes; a zero length ends the block. One
    step per sub-block: a GIF of n bytes takes about n / 255 steps.
    """
    raw = tf.concat([tf.cast(tf.io.decode_raw(data, tf.uint8), tf.int64), tf.zeros([16], tf.int64)], 0)
    size = tf.size(raw, tf.int64) - 16

    def table(packed):  # a colour table's bytes, by its descriptor's packed field
        return tf.where(packed >= 128, 3 * tf.bitwise.left_shift(tf.constant(2, tf.int64), packed % 8), 0)

    def at(i):
        return raw[tf.minimum(tf.cast(i, tf.int64), size)]  # past the end: the zero padding

    def step(position, in_block, frames, width, height):
        def next_sub_block():
            length = at(position)
            return position + length + 1, length > 0, frames, width, height

        def next_block():
            kind = at(position)
            is_image = tf.equal(kind, 0x2C)
            skip = tf.where(is_image, 10 + table(at(position + 9)) + 1, 2)  # + LZW code size; extension label
            frame_width = at(position + 5) + 256 * at(position + 6)
            frame_height = at(position + 7) + 256 * at(position + 8)
            known = tf.logical_or(is_image, tf.equal(kind, 0x21))
            return (tf.where(known, position + skip, size), known,  # anything else ends the walk
                    frames + tf.cast(is_image, tf.int64), tf.where(is_image, tf.maximum(width, frame_width), width),
                    tf.where(is_image, tf.maximum(height, frame_height), height))

        return tf.cond(in_block, next_sub_block, next_block)

    start = 13 + table(at(10))
    zero = tf.constant(0, tf.int64)
    _, _, frames, width, height = tf.while_loop(
        lambda position, *_: position < size, step, (start, tf.constant(False), zero, zero, zero),
        parallel_iterations=1)
    return frames, width, height


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
        pixels = _declared_pixels(data, header, tf.maximum(kind, 0))
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
    an image several times slower (about 0.6 ms of a Ti/16 request at 224 px)
    than this, which gives the same values to a rounding.
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

    # The loop's set-up costs about a fifth of a JPEG's decode: a request of one image, the commonest, skips it.
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

