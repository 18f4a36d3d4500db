"""The trainer on Keras' JAX backend over two host CPU devices (`keras.distribution`): its data-parallel and
model-parallel steps are one device's, accumulation included; it resumes exactly from its own checkpoints; its
command line trains; what is TensorFlow's is refused (tests/trainers/jax_trainer_worker.py)."""

import json
import sys

import numpy as np
import pytest

import keras_vit
from tests.processes import run_together
from tests.trainers.test_train import ENV, ROOT, TINY_FLAGS, data_dir  # noqa: F401 -- data_dir: the fixture

pytestmark = pytest.mark.slow
JAX_ENV = {**ENV, "KERAS_BACKEND": "jax",
           "XLA_FLAGS": f"{ENV.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=2".strip()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, data_dir):  # noqa: F811
    """{name: (CompletedProcess, its directory)}: the worker's modes and the command line's run, in processes
    started together."""
    dirs = {name: tmp_path_factory.mktemp(name) for name in ("worker", "cli")}
    commands = {
        "worker": ["tests.trainers.jax_trainer_worker", str(dirs["worker"]), data_dir],
        "cli": ["trainers.train", f"--model_dir={dirs['cli'] / 'run'}", f"--data_dir={data_dir}", *TINY_FLAGS,
                "--train_steps=10", "--checkpoint_every=5", "--validation_fraction=0"],
    }
    results = run_together([[sys.executable, "-m", *command] for command in commands.values()], cwd=ROOT,
                           env=JAX_ENV)
    return {name: (result, dirs[name]) for name, result in zip(commands, results, strict=True)}


def mode(runs, name):
    """The worker's output for mode `name`; fails with the mode's error if it raised."""
    result, out = runs["worker"]
    assert result.returncode == 0, result.stderr[-3000:]
    error = out / f"{name}.error"
    assert not error.exists(), error.read_text()[-3000:]
    return np.load(out / f"{name}.npz")


def assert_same_weights(a, b, atol):
    keys = [k for k in a.files if k.startswith("w")]
    assert keys and keys == [k for k in b.files if k.startswith("w")]
    for key in keys:
        np.testing.assert_allclose(a[key], b[key], atol=atol, err_msg=key)


def test_two_data_parallel_devices_with_accumulation_take_one_devices_steps(runs):
    one, parallel = mode(runs, "one"), mode(runs, "data_parallel")
    assert int(one["shards"]) == 1 and int(parallel["shards"]) == 2 and int(parallel["devices"]) == 2
    assert str(parallel["backend"]) == "jax" and parallel["accumulating"] and not one["accumulating"]
    assert_same_weights(one, parallel, atol=2e-5)


def test_a_model_split_over_two_devices_takes_one_devices_steps(runs):
    one, split = mode(runs, "one"), mode(runs, "model_parallel")
    assert int(split["shards"]) == 1 and int(split["devices"]) == 2
    assert_same_weights(one, split, atol=2e-5)


def test_a_run_resumed_from_its_checkpoint_ends_with_the_uninterrupted_weights(runs):
    assert_same_weights(mode(runs, "one"), mode(runs, "resumed"), atol=0)
    metrics = json.loads((runs["worker"][1] / "resumed" / "metrics.json").read_text())
    assert metrics["step"] == 10 and metrics["backend"] == "jax"


def test_a_model_the_model_axis_does_not_split_is_refused_before_anything_is_written(runs):
    result, out = runs["worker"]
    error = (out / "indivisible.error").read_text().splitlines()[0]
    assert error == ("ValueError: `num_heads`=3 must be a multiple of the model axis' 2 devices; `mlp_dim`=65 must "
                     "be a multiple of the model axis' 2 devices (--strategy=model_parallel, --model_axis_size)")
    assert not (out / "indivisible").exists()


def test_several_hosts_are_refused(monkeypatch):
    from trainers import jax_distribution

    monkeypatch.setenv("KERAS_DISTRIBUTION_NUM_PROCESSES", "2")
    with pytest.raises(ValueError, match=r"^KERAS_DISTRIBUTION_NUM_PROCESSES=2: the trainer runs on one host on "
                                         r"Keras' JAX backend \(its evaluation would hang across hosts\)"):
        jax_distribution.check_one_host()
    monkeypatch.setenv("KERAS_DISTRIBUTION_NUM_PROCESSES", "1")
    jax_distribution.check_one_host()


def test_deit_distils_on_two_devices_and_a_saved_model_teacher_is_refused(runs):
    deit = mode(runs, "deit")
    assert int(deit["shards"]) == 2
    out = runs["worker"][1]
    student = keras_vit.load_model(out / "deit" / "model.keras")
    assert student.vit_config.distilled and np.isfinite(json.loads((out / "deit" / "metrics.json").read_text())[
        "eval_loss"])
    error = (out / "saved_model_teacher.error").read_text().splitlines()[0]
    assert "is a SavedModel, which runs inside the training step on Keras' TensorFlow backend only; on jax" in error
    assert not (out / "saved_model_teacher").exists()


def test_the_command_line_trains_on_every_device_and_writes_what_tensorflow_reads(runs):
    result, out = runs["cli"]
    assert result.returncode == 0, result.stderr[-3000:]
    run = out / "run"
    metrics = json.loads((run / "metrics.json").read_text())
    assert (metrics["backend"], metrics["devices"], metrics["step"]) == ("jax", 2, 10)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["checkpoint", "ckpt-10.npz", "ckpt-5.npz"]
    # This process runs TensorFlow: the JAX run's model.keras and model.npz load here and agree.
    saved = keras_vit.load_model(run / "model.keras")
    images = np.random.default_rng(0).uniform(-1, 1, (2, 8, 8, 1)).astype("float32")
    official = keras_vit.ViT(saved.vit_config, input_shape=(8, 8, 1), classes=10, classifier_activation=None,
                             weights=str(run / "model.npz"))
    np.testing.assert_allclose(np.asarray(saved(images)), np.asarray(official(images)), atol=1e-6)
    assert f"test top-1 {metrics['eval_top1']:.4f}" in result.stdout


@pytest.mark.parametrize("strategy, axis, message", [
    ("tpu", 0, "--strategy=tpu is a tf.distribute strategy (KERAS_BACKEND=tensorflow); on Keras' JAX backend use "
               "--strategy=auto or data_parallel"),
    ("mirrored", 0, "--strategy must be one of ('auto', 'data_parallel', 'model_parallel', 'cpu') on Keras' JAX "
                    "backend; received strategy='mirrored'"),
    ("data_parallel", 2, "--model_axis_size=2 sizes model_parallel's model axis; received --strategy=data_parallel"),
])
def test_a_strategy_jax_cannot_run_is_named_before_any_device_is_touched(strategy, axis, message):
    """The command line's road (`refuse`, one line) is the other refusals'; the checks need neither JAX nor a device."""
    from trainers import jax_distribution

    with pytest.raises(ValueError) as raised:
        jax_distribution.check_strategy(strategy, axis)
    assert str(raised.value).startswith(message)
