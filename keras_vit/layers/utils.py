"""Argument checks shared by the layers and the model builder."""

import numbers


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
