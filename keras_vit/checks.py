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
