import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# XLA's code generation at LLVM -O0, here and in every process a test starts (they inherit it): the tests' models are
# tiny and run a few steps, so optimising the machine code costs more than it saves (BUILD.md). Read by TensorFlow's
# and JAX's XLA on first use, hence before anything imports them.
if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0".strip()

import keras  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    """Each test starts from float32, a fixed seed and no leftover graphs."""
    keras.mixed_precision.set_global_policy("float32")
    keras.utils.set_random_seed(0)
    yield
    keras.mixed_precision.set_global_policy("float32")
    # Without Keras' full gc.collect(): over a worker's heap (TensorFlow, every module the tests imported) it cost
    # about 0.4 s a test, a fifth of the suite; Python's own collector still frees cycles as they pile up.
    keras.backend.clear_session(free_memory=False)


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: end-to-end tests that take tens of seconds")


# The files that take minutes, longest first (by their measured durations): run ahead of the rest, so
# that no worker is left running one alone at the end. pytest-xdist's `--dist loadfile` hands out whole files
# in collection order (pytest.ini turns off its own reordering by test count).
SLOWEST_FIRST = ("test_docs.py", "trainers/test_train.py", "test_model.py", "export/test_saved_model.py",
                 "backends/test_backends.py", "trainers/test_combinations.py", "test_run.py",
                 "export/test_serving_matrix.py", "trainers/test_jax_trainer.py")


def pytest_collection_modifyitems(config, items):
    def rank(item):
        path = item.path.relative_to(config.rootpath / "tests").as_posix()
        return SLOWEST_FIRST.index(path) if path in SLOWEST_FIRST else len(SLOWEST_FIRST)

    items.sort(key=rank)  # stable: within a rank, the collection order
