import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    """Each test starts from float32, a fixed seed and no leftover graphs."""
    keras.mixed_precision.set_global_policy("float32")
    keras.utils.set_random_seed(0)
    yield
    keras.mixed_precision.set_global_policy("float32")
    keras.backend.clear_session()


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: end-to-end tests that take tens of seconds")
