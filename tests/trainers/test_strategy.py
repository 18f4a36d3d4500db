import pytest
import tensorflow as tf

from trainers import recipes, train
from trainers.strategy import make_strategy


def test_auto_on_this_machine_is_the_default_strategy(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("TPU_NAME", raising=False)
    strategy, kind = make_strategy("auto")
    expected = "gpu" if tf.config.list_physical_devices("GPU") else "cpu"
    assert kind == expected and strategy.num_replicas_in_sync >= 1


@pytest.mark.skipif(bool(tf.config.list_physical_devices("GPU")), reason="this machine has a GPU")
def test_missing_devices_fail_at_once_with_a_message(monkeypatch):
    with pytest.raises(RuntimeError, match="--strategy=gpu but TensorFlow sees no GPU"):
        make_strategy("gpu")
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(RuntimeError, match="needs TF_CONFIG"):
        make_strategy("multi_worker")
    with pytest.raises(ValueError, match="received strategy='mirrored'"):
        make_strategy("mirrored")


def test_tpu_without_a_tpu_fails_at_once():
    with pytest.raises(RuntimeError, match="--strategy=tpu but no TPU could be reached"):
        make_strategy("tpu", tpu="no-such-tpu-here")


@pytest.mark.parametrize("jit_compile, kind, expected", [
    ("auto", "cpu", False), ("auto", "multi_worker", False), ("auto", "gpu", True), ("auto", "tpu", True),
    ("true", "cpu", True), ("false", "tpu", False)])
def test_jit_compile_auto_asks_for_xla_on_tpu_and_gpu(jit_compile, kind, expected):
    recipe = recipes.RECIPES["digits"].replace(jit_compile=jit_compile)
    assert train._execution_settings(recipe, tf.distribute.get_strategy(), kind) == (25, expected)
