"""Initializer copies with seeds of their own.

A Keras 3 initializer fixes its seed when it is made and draws the same values
at every call, so one instance shared by two weights gives both the same
numbers (tests/test_model.py checks that no two random weights do).
"""


def fresh_copy(initializer):
    """`initializer` again with a new default seed; one without a seed (e.g. zeros) as it is."""
    config = initializer.get_config()
    return type(initializer).from_config({**config, "seed": None}) if "seed" in config else initializer
