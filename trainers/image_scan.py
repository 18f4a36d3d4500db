"""A cheap check of a folder of images before training: sizes and header bytes, no decoding.

One empty or corrupt file would otherwise stop a run at whatever step first
reads it, with a decode error that does not name the file. Reading the first
bytes of each file finds empty, truncated-to-nothing and non-image files (an
HTML error page saved as .jpg, say) in seconds even for large folders.
"""

import os

from keras_vit.image_formats import HEADER_BYTES, header_problem

# A PNG's signature plus its IHDR chunk; the smallest valid JPEG is larger still.
MIN_BYTES = 33


def problem(path):
    """Why `path` cannot be a decodable image, or None when its size and header look right."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            header = f.read(HEADER_BYTES)
    except OSError as error:
        return f"unreadable ({error.strerror})"
    if size == 0:
        return "empty (0 bytes)"
    # By content, as the decoder goes: a GIF, BMP or WebP saved as .jpg trains.
    problem_in_header = header_problem(header)
    if problem_in_header is None and size < MIN_BYTES:
        return f"truncated ({size} bytes)"
    return problem_in_header
