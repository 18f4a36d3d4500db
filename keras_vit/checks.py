"""Argument checks shared by `ViTConfig`, the layers and the builders; they import neither Keras nor TensorFlow.

Each returns the value it accepts (normalised) or raises a ValueError naming what was expected and what came.
"""

import math
import numbers
import os
import re


def to_pair(value, name):
    """Returns `value` as a pair of positive ints; one int means a square."""
    pair = (value, value) if isinstance(value, numbers.Integral) else tuple(value or ())
    if len(pair) != 2 or not all(
        isinstance(v, numbers.Integral) and not isinstance(v, bool) and v > 0 for v in pair
    ):
        raise ValueError(
            f"`{name}` must be a positive int or a pair of positive ints; "
            f"received {name}={value!r}"
        )
    return tuple(int(v) for v in pair)


def check_choice(value, choices, name):
    """Returns `value`; raises a ValueError naming the accepted values otherwise."""
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {choices}; received {name}={value!r}")
    return value


def check_count(value, name, minimum=0):
    """Returns `value` as an int; raises a ValueError unless it is an integer >= `minimum` (not a bool)."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"`{name}` must be an int >= {minimum}; received {name}={value!r}")
    return int(value)


def check_float(value, name, low, high=None, low_open=False):
    """Returns `value`; raises a ValueError unless it is a finite real in [low, high) ((low, ...) if `low_open`).

    `high` None is unbounded. A bool is not a float.
    """
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low) and (high is None or value < high)
    if not ok:
        bounds = f"{'(' if low_open else '['}{low}, {'inf)' if high is None else f'{high})'}"
        raise ValueError(f"`{name}` must be a float in {bounds}; received {name}={value!r}")
    return value


def check_bool(value, name):
    """Returns `value`; raises a ValueError unless it is a bool."""
    if not isinstance(value, bool):
        raise ValueError(f"`{name}` must be a bool; received {name}={value!r}")
    return value


# A Hugging Face hub repository id, `org/name`.
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


def is_hub_id(text):
    """Whether `text` has the form of a Hugging Face hub id (`org/name`) and names no local file or directory."""
    return HUB_ID.fullmatch(str(text)) is not None and not os.path.exists(str(text))


def check_input_shape(expected, received, what="The model", multiple=None):
    """Raises a ValueError unless `received` has the rank of `expected` and every size it fixes.

    The first (batch) axis and a None in `expected` take any size; with
    `multiple` (a patch's (height, width)), height and width must be
    divisible by it. A None in `received` (a size unknown while tracing), or
    `received` None (an unknown rank), passes: the caller checks it when the
    graph runs.
    """
    expected, received = tuple(expected), None if received is None else tuple(received)
    if received is None:
        return
    names = " (batch, height, width, channels)" if len(expected) == 4 else ""
    if _fits(received[1:], expected[1:]):
        sizes = zip(received[1:3], multiple or (), strict=bool(multiple))
        if not any(size and size % patch for size, patch in sizes):
            return
        raise ValueError(f"{what} expects inputs of shape {expected}{names}, height and width divisible by "
                         f"`patch_size`={tuple(multiple)}; received shape {received}")
    hints = []
    if _fits(received, expected[1:]):
        hints.append("one image needs a batch axis (x[None])")
    elif len(received) == len(expected) - 1 and expected[-1] == 1:
        hints.append("a grey image needs its channel axis (x[..., None])")
    elif len(received) == len(expected) == 4:
        if not _fits(received[3:], expected[3:]):
            hints.append(f"the model takes {expected[-1]} channel(s)")
        if not _fits(received[1:3], expected[1:3]):
            hints.append(f"resize the images to {expected[1]}x{expected[2]} (keras_vit.resize_and_center_crop) or "
                         "build the model with dynamic_image_size=True")
    hint = "".join(f"; {h}" for h in hints)
    raise ValueError(f"{what} expects inputs of shape {expected}{names}; received shape {received}{hint}")


def _fits(sizes, fixed):
    """Whether `sizes` has the rank of `fixed` and its sizes where both are known."""
    return len(sizes) == len(fixed) and all(f is None or s is None or f == s for f, s in zip(fixed, sizes, strict=True))
