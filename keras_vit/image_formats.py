"""Encoded images to uint8 pixels with a model's channels, in graph ops, alike for every format.

TensorFlow's decoders read JPEG, PNG, GIF, BMP and WebP, but not alike: GIF,
BMP and WebP decode only to colour; WebP gives the image's own channels (RGB or
RGBA) and fails when asked for three; and none reads an animated WebP as one
image (one of its paths crashes the process). `decode` gives every still image
the channels asked for, alpha dropped as PNG's decoder drops it and grey made
from colour where the decoder has none, and refuses an animated WebP from its
header before any decoder sees it. The trainer, the exported request graph
and `keras_vit.explain` decode through here, so a file means one image to all.
"""

import tensorflow as tf

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
        webp = lambda: tf.ensure_shape(decoded(0)[..., :3], [None, None, 3])
        return tf.cond(tf.equal(kind, WEBP), webp, lambda: decoded(3))

    if channels == 3:
        return colour()
    if channels != 1:
        return decoded(channels)
    grey = lambda: tf.cast(tf.round(tf.image.rgb_to_grayscale(tf.cast(colour(), tf.float32))), tf.uint8)
    return tf.cond(kind >= GIF, grey, lambda: decoded(1))  # GIF, BMP and WebP decode only to colour
