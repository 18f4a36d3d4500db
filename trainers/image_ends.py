"""Whether an encoded image is whole: its end marker where its format puts it, else a decode decides.

A file cut after its header passes a header-only scan and then stops training
with a decode error that names nothing (`jpeg::Uncompress failed`), at the
same step on every rerun. Every format TensorFlow decodes says where it ends:
JPEG with its EOI marker, PNG with its IEND chunk, GIF with its trailer byte,
BMP and WebP with a size in the header. Reading the last bytes of each image
finds the cut ones for the cost of a seek; the few that fail this test are
decoded once, so an image with bytes after its end (some cameras append data)
is kept when the decoder reads it.
"""

import re

import tensorflow as tf

from keras_vit import image_formats

TAIL_BYTES = 16
_JPEG_END, _PNG_END, _GIF_END = b"\xff\xd9", b"IEND\xaeB`\x82", b";"


def is_whole(header, tail, size):
    """Whether an image of `size` bytes with these first and last bytes ends where its format says.

    False for a file that is none of the formats (the header scan names those).
    """
    kind = next((k for k, signature in enumerate(image_formats.SIGNATURES)
                 if all(header[at: at + len(magic)] == magic for magic, at in signature)), None)
    if kind == image_formats.JPEG:
        return tail.rstrip(b"\0\r\n ").endswith(_JPEG_END)  # padding after EOI is common and harmless
    if kind == image_formats.PNG:
        return tail.endswith(_PNG_END)
    if kind == image_formats.GIF:
        return tail.endswith(_GIF_END)
    if kind == image_formats.BMP:
        return len(header) >= 6 and size >= int.from_bytes(header[2:6], "little")
    if kind == image_formats.WEBP:
        return len(header) >= 8 and size >= int.from_bytes(header[4:8], "little") + 8
    return False


def decode_problem(data, channels):
    """None when `data` decodes to an image of `channels`, else the decoder's reason (first line)."""
    try:
        image_formats.decode(data, channels)
    except tf.errors.OpError as error:
        reason = error.message.strip().splitlines()[0] if error.message.strip() else type(error).__name__
        # Eager errors wrap the decoder's words in the op's graph names: "{{function_node ...}} WORDS [Op:...]".
        reason = re.sub(r"\{\{[^}]*\}\}\s*|\s*\[Op:\w+\]", "", reason) or type(error).__name__
        return f"cannot be decoded, cut short or corrupt ({reason})"
    return None


def file_problem(path, channels=3):
    """None when the image file at `path` is whole or decodes anyway, else why it cannot be decoded."""
    with open(path, "rb") as f:
        header = f.read(image_formats.HEADER_BYTES)
        size = f.seek(0, 2)
        f.seek(max(size - TAIL_BYTES, 0))
        tail = f.read()
    if is_whole(header, tail, size):
        return None
    with open(path, "rb") as f:
        return decode_problem(f.read(), channels)


def record_ends(encoded):
    """(header, tail, size) of a batch of encoded images, in graph ops: what `is_whole` reads."""
    size = tf.strings.length(encoded)
    header = tf.strings.substr(encoded, 0, image_formats.HEADER_BYTES)
    tail = tf.strings.substr(encoded, tf.maximum(size - TAIL_BYTES, 0), tf.minimum(size, TAIL_BYTES))
    return header, tail, size
