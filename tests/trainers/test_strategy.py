import pytest
import tensorflow as tf

from trainers import loop, recipes
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


@pytest.mark.parametrize("cluster, gpus, expected", [
    ({"chief": ["a:1"], "worker": ["b:1"]}, [], "multi_worker"),  # a chief and one worker: two tasks
    ({"worker": ["a:1", "b:1"]}, ["GPU:0"], "multi_worker"),  # GPU hosts of a cluster train together
    ({"worker": ["a:1"]}, ["GPU:0"], "gpu"), ({}, [], "cpu")])
def test_auto_picks_the_cluster_before_the_local_gpus(monkeypatch, cluster, gpus, expected):
    import json

    monkeypatch.delenv("TPU_NAME", raising=False)
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}}))
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: gpus if kind == "GPU" else [])
    # Stand-ins: the real ones would join the cluster or claim the GPUs.
    monkeypatch.setattr(tf.distribute, "MultiWorkerMirroredStrategy", lambda: "multi-worker strategy")
    monkeypatch.setattr(tf.distribute, "MirroredStrategy", lambda: "mirrored strategy")
    assert make_strategy("auto")[1] == expected


def test_a_malformed_tf_config_is_named(monkeypatch):
    monkeypatch.delenv("TPU_NAME", raising=False)
    for text in ("{cluster", '["worker"]'):
        monkeypatch.setenv("TF_CONFIG", text)
        with pytest.raises(ValueError, match=r"TF_CONFIG must be JSON like .*received TF_CONFIG="):
            make_strategy("auto")


def test_tpu_without_a_tpu_fails_at_once():
    with pytest.raises(RuntimeError, match="--strategy=tpu but no TPU could be reached"):
        make_strategy("tpu", tpu="no-such-tpu-here")


@pytest.mark.parametrize("jit_compile, kind, expected", [
    ("auto", "cpu", False), ("auto", "multi_worker", False), ("auto", "gpu", True), ("auto", "tpu", True),
    ("true", "cpu", True), ("false", "tpu", False)])
def test_jit_compile_auto_asks_for_xla_on_tpu_and_gpu(jit_compile, kind, expected):
    recipe = recipes.RECIPES["digits"].replace(jit_compile=jit_compile)
    assert loop._execution_settings(recipe, tf.distribute.get_strategy(), kind) == (25, expected)
