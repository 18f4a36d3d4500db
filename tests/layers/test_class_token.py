import numpy as np

from keras_vit.layers import ClassToken, DistillationToken
from tests.layer_checks import check_layer


def test_standard_checks(tmp_path):
    patches = np.random.rand(3, 2, 2, 8).astype("float32")
    out = check_layer(ClassToken(), tmp_path, patches)
    assert out.shape == (3, 1, 8)


def test_token_starts_at_zero_and_is_shared_by_the_batch():
    layer = ClassToken()
    out = np.asarray(layer(np.ones((3, 2, 2, 8), "float32")))
    np.testing.assert_array_equal(out, 0.0)
    layer.token.assign(np.arange(8, dtype="float32").reshape(1, 1, 8))
    out = np.asarray(layer(np.ones((3, 2, 2, 8), "float32")))
    np.testing.assert_array_equal(out, np.broadcast_to(np.arange(8.0), (3, 1, 8)))


def test_distillation_token_is_its_own_layer_drawn_from_a_truncated_normal(tmp_path):
    patches = np.random.rand(3, 2, 2, 64).astype("float32")
    out = check_layer(DistillationToken(), tmp_path, patches)
    assert out.shape == (3, 1, 64)
    token = DistillationToken()
    token.build((None, 2, 2, 4096))
    values = token.token.numpy()
    assert 0.015 < values.std() < 0.025 and np.abs(values).max() <= 0.04 + 1e-6
