import numpy as np
import pytest

from keras_vit.layers import RegisterTokens
from tests.layer_checks import check_layer


def test_standard_checks(tmp_path):
    patches = np.zeros((2, 2, 3, 8), "float32")
    assert check_layer(RegisterTokens(4), tmp_path, patches).shape == (2, 4, 8)


def test_every_example_gets_the_same_distinct_tokens():
    layer = RegisterTokens(3, initializer="random_normal")
    tokens = np.asarray(layer(np.zeros((2, 4, 4, 8), "float32")))
    np.testing.assert_array_equal(tokens[0], tokens[1])
    assert len({tuple(row) for row in tokens[0]}) == 3


def test_bad_count():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match=rf"`count` must be an int >= 1; received count={bad}"):
            RegisterTokens(bad)
