import numpy as np
import pytest

from keras_vit.layers import SequencePooling
from tests.layer_checks import check_layer

TOKENS = np.arange(2 * 4 * 3, dtype="float32").reshape(2, 4, 3)


def test_standard_checks(tmp_path):
    assert check_layer(SequencePooling("gap", 1), tmp_path, TOKENS).shape == (2, 3)


def test_values():
    np.testing.assert_array_equal(np.asarray(SequencePooling("token", 1)(TOKENS)), TOKENS[:, 0])
    np.testing.assert_allclose(np.asarray(SequencePooling("gap", 1)(TOKENS)), TOKENS[:, 1:].mean(1))
    np.testing.assert_allclose(np.asarray(SequencePooling("gap", 0)(TOKENS)), TOKENS.mean(1))
    np.testing.assert_array_equal(np.asarray(SequencePooling("max", 1)(TOKENS)), TOKENS[:, 1:].max(1))


def test_bad_arguments():
    with pytest.raises(ValueError, match="received mode='mean'"):
        SequencePooling("mean")
    with pytest.raises(ValueError, match="num_prefix_tokens=0"):
        SequencePooling("token", 0)
    # DeiT's distillation token is the second prefix token: with fewer, a patch's token would be pooled.
    np.testing.assert_array_equal(np.asarray(SequencePooling("distillation", 2)(TOKENS)), TOKENS[:, 1])
    with pytest.raises(ValueError, match=r"mode='distillation' pools prefix token 1 .* received num_prefix_tokens=1"):
        SequencePooling("distillation", 1)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match=rf"`num_prefix_tokens` must be an int >= 0; received .*={bad}"):
            SequencePooling("gap", bad)
