"""Encoded images to uint8 pixels with a model's channels, in graph ops, alike for every format.

TensorFlow's decoders read JPEG, PNG, GIF, BMP and WebP, but not alike: GIF,
BMP and WebP decode only to colour; WebP gives the image's own channels (RGB or
RGBA) and fails when asked for three; and none reads an animated WebP as one
image (one of its paths crashes the process). `decode` gives every still image
the channels asked for, alpha dropped as PNG's decoder drops it and grey made
from colour where the decoder has none, and refuses an animated WebP from its
header before any decoder sees it. The trainer, the exported request graph
and `keras_vit.explain` decode through here, so a file means one image to all.

Every check an image's header allows lives here too, once per form: in graph
ops (`image_format`, `is_animated_webp`, `declared_pixels`, which the
exported request graph asserts on) and on Python bytes (`header_problem`,
for the trainer's scan of a folder and `keras_vit.explain`'s image).

Without TensorFlow (a JAX or PyTorch install), `decode_with_pillow` gives
`decode`'s pixels from Python bytes, through Pillow (matplotlib's dependency,
so there with `keras_vit.explain`'s `viz` extra); the header checks on
Python bytes need neither.
"""

import io

try:
    import tensorflow as tf
except ImportError:  # the checks on Python bytes and `decode_with_pillow` run without it
    tf = None

NAMES = ("JPEG", "PNG", "GIF", "BMP", "WebP")
JPEG, PNG, GIF, BMP, WEBP = range(len(NAMES))
FORMATS = ", ".join(NAMES[:-1]) + " or " + NAMES[-1]
# Each format's magic bytes, as (bytes, offset) pairs, in NAMES order: a WebP is a RIFF file of form WEBP.
SIGNATURES = (((b"\xff\xd8\xff", 0),), ((b"\x89PNG\r\n\x1a\n", 0),), ((b"GIF8", 0),), ((b"BM", 0),),
              ((b"RIFF", 0), (b"WEBP", 8)))
HEADER_BYTES = 32


def header(data):
    """The first 32 bytes of `data` as int64, zero-padded when the data is shorter."""
    head = tf.strings.substr(data, 0, HEADER_BYTES) + b"\0" * HEADER_BYTES
    return tf.cast(tf.io.decode_raw(tf.strings.substr(head, 0, HEADER_BYTES), tf.uint8), tf.int64)


def starts_with(header, signature, at=0):
    return tf.reduce_all(tf.equal(header[at: at + len(signature)], list(signature)))


def image_format(header):
    """JPEG, PNG, GIF, BMP or WEBP by the magic bytes, -1 for anything else."""
    checks = [tf.reduce_all([starts_with(header, magic, at) for magic, at in signature]) for signature in SIGNATURES]
    return tf.reduce_max(tf.where(tf.stack(checks), tf.range(len(NAMES)), -1))


def is_animated_webp(header, image_format):
    # An extended (VP8X) WebP's flags byte, bit 1.
    return tf.logical_and(tf.equal(image_format, WEBP), tf.logical_and(
        starts_with(header, b"VP8X", 12), tf.bitwise.bitwise_and(header[20], 2) > 0))


def format_of_bytes(first_bytes):
    """`image_format` of Python bytes (an image's first `HEADER_BYTES`): its index in `NAMES`, None for none."""
    return next((kind for kind, signature in enumerate(SIGNATURES)
                 if all(first_bytes[at: at + len(magic)] == magic for magic, at in signature)), None)


def header_problem(first_bytes):
    """Why the image starting with `first_bytes` cannot be decoded as one image, or None when its header is right.

    Not an image of `FORMATS` (by its magic bytes, as the decoder goes by
    content, not by a file's extension), or an animated WebP (TensorFlow's
    decoder reads none as one image).
    """
    kind = format_of_bytes(first_bytes)
    if kind is None:
        return f"not a {FORMATS} image (starts with {bytes(first_bytes[:4])!r})"
    # An extended (VP8X) WebP's flags byte, bit 1: `is_animated_webp` in graph ops.
    if kind == WEBP and first_bytes[12:16] == b"VP8X" and len(first_bytes) > 20 and first_bytes[20] & 0x02:
        return "an animated WebP (TensorFlow's decoder reads none as one image)"
    return None


def _number(header, start, count, big_endian):
    """An unsigned integer of `count` bytes at `start` of the header."""
    order = range(count) if big_endian else reversed(range(count))
    value = tf.constant(0, tf.int64)
    for k in order:
        value = value * 256 + header[start + k]
    return value


def declared_pixels(data, header, kind):
    """Width x height the image of format `kind` declares, from its header (GIF: x its frames, at least 1).

    Read before any decoding, so a request or a file that declares a huge
    image (a decompression bomb) can be refused before its pixels exist.
    """
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

    return tf.switch_case(kind, [jpeg, png, gif, bmp, webp])  # in NAMES order


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


def decode(data, channels):
    """uint8 [height, width, channels] of a still image; InvalidArgument for anything else."""
    head = header(data)
    kind = image_format(head)
    # Checked before the decoder runs: asked for the image's own channels, it crashes on an animation.
    still = tf.debugging.Assert(tf.logical_not(is_animated_webp(head, kind)), [
        "an animated WebP: TensorFlow's decoder reads none as one image; save one frame"])

    def decoded(count):
        with tf.control_dependencies([still]):
            return tf.io.decode_image(data, channels=count, expand_animations=False)

    def colour():
        def webp():
            return tf.ensure_shape(decoded(0)[..., :3], [None, None, 3])

        return tf.cond(tf.equal(kind, WEBP), webp, lambda: decoded(3))

    if channels == 3:
        return colour()
    if channels != 1:
        return decoded(channels)
    def grey():
        return tf.cast(tf.round(tf.image.rgb_to_grayscale(tf.cast(colour(), tf.float32))), tf.uint8)

    return tf.cond(kind >= GIF, grey, lambda: decoded(1))  # GIF, BMP and WebP decode only to colour


def decode_with_pillow(data, channels):
    """uint8 numpy `[height, width, channels]` of a still image's bytes, as `decode` gives, through Pillow.

    Alpha is dropped (or made opaque when asked for) and grey made from
    colour (ITU-R 601 weights, as TensorFlow's), the first frame of a GIF read; ValueError when Pillow is
    not installed or the image is damaged, naming its format.
    """
    import numpy as np

    try:
        from PIL import Image
    except ImportError as error:
        raise ValueError("Decoding an image without TensorFlow needs Pillow: pip install "
                         "'keras-vision-transformer[viz]' (in a checkout: pip install -e '.[viz]'; or pillow), or "
                         "install TensorFlow") from error
    modes = {1: "L", 2: "LA", 3: "RGB", 4: "RGBA"}  # TensorFlow's decoders' channel counts
    if channels not in modes:
        raise ValueError(f"`channels` must be one of {sorted(modes)}; received channels={channels!r}")
    problem = header_problem(data[:HEADER_BYTES])
    if problem:
        raise ValueError(f"The image is {problem}")
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.seek(0)  # a GIF's first frame, as TensorFlow's decoder returns
            pixels = np.asarray(image.convert(modes[channels]), np.uint8)
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        raise ValueError(f"a damaged {NAMES[format_of_bytes(data)]} image: {error}") from error
    return pixels.reshape(pixels.shape[:2] + (channels,))
