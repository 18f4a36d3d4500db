"""The suite's own scheduling (tests/conftest.py) names files that exist."""

import pathlib

from tests.conftest import SLOWEST_FIRST


def test_the_slowest_files_named_first_exist():
    # A renamed file would silently lose its place at the head of the queue, and a worker would be left
    # running it alone at the end (CI time).
    missing = [path for path in SLOWEST_FIRST if not (pathlib.Path(__file__).parent / path).is_file()]
    assert not missing, f"tests/conftest.py SLOWEST_FIRST names files that do not exist: {missing}"
