"""End to end: the trainer trains, resumes exactly, stops on NaN, honours the
strategy, writes beside other workers safely, and rejects bad flags. Each run
is a tiny digits ViT."""

import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.processes import run_together

ROOT = pathlib.Path(__file__).parents[2]
TINY_FLAGS = ["--hidden_size=32", "--mlp_dim=64", "--num_heads=2", "--num_layers=1", "--batch_size=16",
              "--steps_per_execution=5", "--warmup_steps=5"]


ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}


def run(args, **kwargs):
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=ENV, capture_output=True,
                          text=True, timeout=600, **kwargs)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """The digits' TFDS folder, prepared once here, so that no two processes race to write it."""
    from trainers import data

    path = str(tmp_path_factory.mktemp("tfds"))
    data.load("keras_vit_digits", "train", path)
    return path


VERBOSITY = [([], False), (["--verbosity=0"], True)]
# One command line per road a bad flag takes to the user (each field's own check is tested in-process, in
# test_recipes.py and test_preflight.py): absl's enum check, a recipe field's check, a float flag read as nan.
BAD_FLAGS = [
    ("--strategy=mirrored", "flag --strategy=mirrored: value should be one of "
                            "<auto|tpu|gpu|multi_worker|cpu|data_parallel|model_parallel>"),
    ("--strategy=data_parallel", "--strategy=data_parallel is a keras.distribution of Keras' JAX backend (set "
                                 "KERAS_BACKEND=jax)"),
    ("--batch_size=0", "received batch_size=0"),
    ("--learning_rate=nan", "`learning_rate` must be in (0, inf); received learning_rate=nan"),
    ("--eval_every=-1", "--eval_every must be an int >= 0 (0: at the end only); received eval_every=-1"),
    ("--eval_every=5 --validation_fraction=0", "--eval_every=5 evaluates on a validation split"),
]


@pytest.fixture(scope="module")
def refused_runs(tmp_path_factory):
    """The trainer refusing each bad command line, all in processes started together (each pays TF's import).

    Returns {name: (CompletedProcess, its model_dir or None)}; each model_dir holds a notes.txt beforehand.
    """
    commands = {"no model_dir": (["trainers.train"], None)}
    for verbosity, _ in VERBOSITY:
        model_dir = tmp_path_factory.mktemp("verbosity")
        commands[f"verbosity {verbosity}"] = (
            ["trainers.train", f"--model_dir={model_dir}", f"--dataset=tfrecord:{model_dir}/missing/{{split}}-*",
             "--num_classes=2", *verbosity],
            model_dir)
    for flag, _ in BAD_FLAGS:
        model_dir = tmp_path_factory.mktemp("bad_flag")
        (model_dir / "notes.txt").write_text("kept")
        commands[flag] = (["trainers.train", f"--model_dir={model_dir}", *flag.split()], model_dir)
    results = run_together([[sys.executable, "-m", *args] for args, _ in commands.values()], cwd=ROOT, env=ENV)
    return {name: (result, model_dir) for (name, (_, model_dir)), result in zip(commands.items(), results, strict=True)}


def trainer(model_dir, data_dir, *extra):
    return ["trainers.train", f"--model_dir={model_dir}", f"--data_dir={data_dir}", *TINY_FLAGS, *extra]


def final_weights(model_dir):
    with np.load(pathlib.Path(model_dir) / "model.npz") as f:
        return {k: f[k] for k in f.files}


def event_scalars(folder):
    """{tag: [(step, value)]} of the TensorBoard event files under `folder`."""
    import tensorflow as tf

    scalars = {}
    for path in sorted(pathlib.Path(folder).glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, float(tf.make_ndarray(value.tensor))))
    return scalars


# The model of the scanned run three tests read; layer decay over stacked blocks and PatchDropout ride along.
SCANNED = ["--scan_layers", "--dropout_rate=0.1", "--num_layers=2", "--layer_decay=0.75", "--patch_dropout=0.25"]


@pytest.fixture(scope="module")
def finished_runs(tmp_path_factory, data_dir):
    """Two finished runs, in processes started together (each pays TensorFlow's import: CI time).

    "trained": 300 steps of a wider model, checkpoints every 100, evaluations every 150; "scanned": the scanned
    model, 10 steps in blocks of 4, against checkpoints at 6 and evaluations every 3. {name: (result, model_dir)}.
    """
    model_dirs = {name: tmp_path_factory.mktemp(name) for name in ("trained", "scanned")}
    commands = [trainer(model_dirs["trained"], data_dir, "--train_steps=300", "--checkpoint_every=100",
                        "--hidden_size=64", "--mlp_dim=128", "--num_heads=4", "--eval_every=150"),
                trainer(model_dirs["scanned"], data_dir, *SCANNED, "--train_steps=10", "--checkpoint_every=6",
                        "--eval_every=3", "--steps_per_execution=4")]
    results = run_together([[sys.executable, "-m", *args] for args in commands], cwd=ROOT, env=ENV)
    return {name: (result, model_dir) for (name, model_dir), result in zip(model_dirs.items(), results, strict=True)}


@pytest.fixture(scope="module")
def scanned_run(finished_runs):
    result, model_dir = finished_runs["scanned"]
    assert result.returncode == 0, result.stderr[-3000:]
    return result, model_dir


@pytest.mark.slow
def test_trains_evaluates_and_writes_the_model(finished_runs):
    result, tmp_path = finished_runs["trained"]
    assert result.returncode == 0, result.stderr[-3000:]
    assert "test top-1" in result.stdout and (tmp_path / "model.keras").exists()
    # One bar for the whole run (a line per 5% in a log), not Keras' per-chunk epochs.
    bar = [line for line in result.stdout.splitlines() if line.startswith("step ")]
    # The first execution, then every 15 steps (5% of 300).
    assert [line.split()[1] for line in bar] == ["5/300", *(f"{s}/300" for s in range(15, 301, 15))]
    assert "Epoch" not in result.stdout and bar[-1].startswith("step 300/300 [")
    assert all(" img/s  ETA " in line and "  lr " in line for line in bar)
    losses = [float(line.split("loss ")[1].split()[0]) for line in bar]
    assert losses[-1] < losses[0]
    evals = [line for line in result.stdout.splitlines() if line.startswith("eval at step")]
    assert [int(line.split()[3].rstrip(":")) for line in evals] == [150, 300]
    # Quiet by default: no absl INFO or WARNING lines from Python, no Keras UserWarning.
    assert not re.search(r"^[IW]\d{4} .*\.py:\d+\]", result.stderr, re.M), result.stderr[-3000:]
    assert "Warning" not in result.stderr, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["step"] == 300 and metrics["eval_examples"] == 360 and metrics["eval_top1"] > 0.2  # chance: 0.1
    # 10% of the 1,437 training digits held out: they choose best/; the test split is evaluated once, at the end.
    assert metrics["validation_examples"] == 144 and metrics["eval_split"] == "test"
    assert json.loads((tmp_path / "recipe.json").read_text())["train_steps"] == 300
    assert list((tmp_path / "logs").rglob("events.out.tfevents.*"))  # TensorBoard
    top1 = event_scalars(tmp_path / "logs" / "validation")["top1"]
    assert [step for step, _ in top1] == [150, 300] and np.isclose(top1[-1][1], metrics["validation_top1"])
    test = event_scalars(tmp_path / "logs" / "test")["top1"]
    assert [step for step, _ in test] == [300] and np.isclose(test[0][1], metrics["eval_top1"])
    assert "validation top-1" in result.stdout and "the final model" in result.stdout
    # The best evaluation's checkpoint is kept beside the last ones.
    best = json.loads((tmp_path / "best.json").read_text())
    assert best["eval_top1"] == max(value for _, value in top1) and best["step"] in (150, 300)
    assert (tmp_path / "best" / f"ckpt-{best['step']}.index").exists()
    assert (tmp_path / "checkpoints" / "ckpt-300.index").exists()
    import keras_vit  # the .npz is the official format
    model = keras_vit.ViT(patch_size=2, hidden_size=64, mlp_dim=128, num_heads=4, num_layers=1,
                          input_shape=(8, 8, 1), classes=10, classifier="gap")
    keras_vit.load_npz(model, tmp_path / "model.npz")


def test_chunks_no_multiple_of_steps_per_execution_stop_where_asked(scanned_run):
    # Keras runs whole blocks while data lasts; the trainer stops them where a checkpoint or evaluation falls.
    result, model_dir = scanned_run
    evals = [int(line.split()[3].rstrip(":")) for line in result.stdout.splitlines() if line.startswith("eval at")]
    assert evals == [3, 6, 9, 10]
    assert sorted(int(p.name[5:-6]) for p in (model_dir / "checkpoints").glob("ckpt-*.index")) == [6, 10]
    assert json.loads((model_dir / "metrics.json").read_text())["step"] == 10


@pytest.mark.parametrize("verbosity, shown", VERBOSITY)
def test_info_lines_only_with_verbosity(refused_runs, verbosity, shown):
    """The recipe is logged at INFO before the missing TFRecords (found once TensorFlow runs) stop the run."""
    result, model_dir = refused_runs[f"verbosity {verbosity}"]
    assert result.returncode != 0 and f"No TFRecord files match '{model_dir}/missing/train-*'" in result.stderr
    assert ("Recipe digits on cpu" in result.stderr) == shown


@pytest.mark.slow
def test_killed_and_resumed_ends_with_the_uninterrupted_weights(tmp_path, data_dir):
    """With the fine-tuning options on: the weight EMA (its average checkpointed; model.npz and best/ take it), layer
    decay and two accumulated micro-batches per step."""
    # Two checkpoints are enough: the kill falls after the first (step 10), the resume crosses into the second.
    flags = ["--train_steps=20", "--checkpoint_every=10", "--deterministic", "--drop_path_rate=0.1",
             "--ema_decay=0.9", "--layer_decay=0.75", "--grad_accumulation_steps=2"]
    # The uninterrupted run goes on beside the killed one and its resumption (CI time); op determinism makes
    # the weights independent of what else runs.
    with open(tmp_path / "whole.log", "w") as log:
        whole = subprocess.Popen([sys.executable, "-m", *trainer(tmp_path / "whole", data_dir, *flags)], cwd=ROOT,
                                 env=ENV, stdout=log, stderr=subprocess.STDOUT)
    killed_dir = tmp_path / "killed"
    process = subprocess.Popen([sys.executable, "-m", *trainer(killed_dir, data_dir, *flags)], cwd=ROOT,
                               env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # The manager's state file names a checkpoint once it is whole (the index file comes before it).
    state = killed_dir / "checkpoints" / "checkpoint"
    deadline = time.time() + 300
    while not (state.exists() and "ckpt-10" in state.read_text()) and time.time() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL
    assert not (killed_dir / "model.npz").exists(), "the run finished before it could be killed"

    resumed = run(trainer(killed_dir, data_dir, *flags))
    assert whole.wait(timeout=600) == 0, (tmp_path / "whole.log").read_text()[-3000:]
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Resumed from" in resumed.stdout
    a, b = final_weights(tmp_path / "whole"), final_weights(killed_dir)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    # Killed between checkpoint 10 and its evaluation, the resumed run evaluates step 10 first.
    evaluated = [{step for step, _ in event_scalars(folder / "logs" / "validation")["top1"]}
                 for folder in (tmp_path / "whole", killed_dir)]
    assert evaluated[1] == evaluated[0] == {10, 20}
    best = [json.loads((folder / "best.json").read_text()) for folder in (tmp_path / "whole", killed_dir)]
    assert best[1] == best[0]


@pytest.mark.slow
def test_a_nan_loss_stops_the_run_and_keeps_the_last_checkpoint(tmp_path, data_dir, scanned_run):
    # A new run directory seeded with the finished run's checkpoints (the last at step 10), then a diverging recipe.
    # The loss is non-finite in the first block after step 10, long before step 20; --eval_every=0 spares the
    # evaluation a resumed run owes its checkpoint (its tracing), which has nothing to do with the stop.
    bad = tmp_path / "bad"
    (bad / "checkpoints").mkdir(parents=True)
    for f in (scanned_run[1] / "checkpoints").iterdir():
        (bad / "checkpoints" / f.name).write_bytes(f.read_bytes())
    result = run(trainer(bad, data_dir, *SCANNED, "--train_steps=20", "--checkpoint_every=10", "--eval_every=0",
                         "--learning_rate=1e30", "--warmup_steps=0", "--schedule=constant"))
    assert result.returncode == 1
    assert "The training loss is nan at step" in result.stderr or "The training loss is inf at step" in result.stderr
    state = (bad / "checkpoints" / "checkpoint").read_text()
    assert 'model_checkpoint_path: "ckpt-10"' in state and not (bad / "model.npz").exists()


def test_scan_layers_trains_and_writes_the_unrolled_format(scanned_run):
    import keras_vit
    model = keras_vit.ViT(patch_size=2, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2,
                          input_shape=(8, 8, 1), classes=10, classifier="gap")
    keras_vit.load_npz(model, scanned_run[1] / "model.npz")
    assert np.abs(model.get_layer("encoder_block_1").mlp.dense_1.kernel.numpy()).max() > 0


def test_a_folder_with_bad_images_trains_without_them_when_asked(tmp_path, caplog, capsys):
    """In-process: the flag's road from the command line is test_journey.py's (a folder, --skip_bad_images).

    Without skip_bad_images the run stops before its first step, naming each file: test_preflight.py."""
    import tensorflow as tf

    from tests.trainers.test_preflight import _image_folder
    from trainers import loop, train

    _image_folder(tmp_path / "images")
    model_dir = tmp_path / "run"
    model_dir.mkdir()
    recipe = train.resolve_recipe("digits", dict(dataset=f"folder:{tmp_path / 'images'}", batch_size=2, train_steps=2,
                                                 checkpoint_every=2, steps_per_execution=1, hidden_size=32,
                                                 mlp_dim=64, num_heads=2, num_layers=1))
    with caplog.at_level("WARNING"):
        loop.train(recipe, model_dir, tf.distribute.get_strategy(), "cpu", skip_bad_images=True)
    assert "Skipped 3 undecodable images of split 'train' (--skip_bad_images)" in caplog.text
    assert "step 2/2" in capsys.readouterr().out and (model_dir / "model.npz").exists()


WRITER = """
import pathlib, sys, time
from keras_vit.atomic_files import write_text_atomically
target, ready, go = map(pathlib.Path, sys.argv[1:])
ready.touch()
while not go.exists():
    time.sleep(0.001)
for i in range(500):
    write_text_atomically(target, str(i))
"""


def test_two_processes_writing_one_file_do_not_collide(tmp_path):
    """Workers sharing a model_dir may write the same file at once: each rename must find its own temporary."""
    target, go = tmp_path / "recipe.json", tmp_path / "go"
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(target), str(tmp_path / f"ready{i}"), str(go)],
                                cwd=ROOT, stderr=subprocess.PIPE, text=True) for i in range(2)]
    deadline = time.time() + 120
    while len(list(tmp_path.glob("ready*"))) < 2 and time.time() < deadline:
        time.sleep(0.01)
    go.touch()
    for writer in writers:
        _, err = writer.communicate(timeout=120)
        assert writer.returncode == 0, err[-2000:]
    assert target.read_text() == "499" and sorted(p.name for p in tmp_path.iterdir()) == [
        "go", "ready0", "ready1", "recipe.json"]


def test_threads_writing_one_file_and_a_failed_write_leave_only_the_file(tmp_path):
    import concurrent.futures

    from keras_vit.atomic_files import write_text_atomically

    target = tmp_path / "best.json"
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: write_text_atomically(target, str(i)), range(400)))
    assert target.read_text() in {str(i) for i in range(400)}
    with pytest.raises(UnicodeEncodeError):  # as a full disk would fail it, halfway
        write_text_atomically(target, "\ud800")
    assert [path.name for path in tmp_path.iterdir()] == ["best.json"] and target.read_text().isdigit()


@pytest.mark.parametrize("flag, message", BAD_FLAGS)
def test_bad_flags_are_rejected_with_a_message(refused_runs, flag, message):
    result, model_dir = refused_runs[flag]
    assert result.returncode != 0 and message in result.stderr
    assert [p.name for p in model_dir.iterdir()] == ["notes.txt"]  # nothing written


def test_model_dir_is_required(refused_runs):
    result, _ = refused_runs["no model_dir"]
    assert result.returncode != 0 and "--model_dir is required" in result.stderr


def test_a_bad_flag_is_refused_in_one_line_before_tensorflow_starts(tmp_path):
    """With TensorFlow and Keras unimportable, the refusal is the same: no flag check needs them."""
    model_dir = tmp_path / "never"
    block = ("import runpy, sys; sys.modules.update(tensorflow=None, keras=None); "
             "sys.argv[0] = 'trainers.train'; runpy.run_module('trainers.train', run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", block, "--batch_size=0", f"--model_dir={model_dir}"], cwd=ROOT,
                            env=ENV, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and not model_dir.exists()
    assert result.stderr.splitlines() == ["trainers.train: `batch_size` must be in [1, inf); received batch_size=0",
                                          "See --helpfull for every flag and its help."]


def test_each_field_flag_shows_the_fields_own_help():
    from absl import flags

    from keras_vit.config import FIELDS as MODEL_FIELDS
    from trainers import plan, recipes, train  # noqa: F401 (importing train defines the flags)

    assert plan.MODEL_FIELDS  # the flags are defined on import
    for name, field in {**recipes.FIELDS, **plan.MODEL_FIELDS}.items():
        assert flags.FLAGS[name].help == field.metadata["help"], name
    assert flags.FLAGS["batch_size"].help.startswith("Global batch size of one optimiser step")
    assert flags.FLAGS["classifier"].help == MODEL_FIELDS["classifier"].metadata["help"]


def test_vit_finetune_starts_from_an_imagenet21k_style_checkpoint(tmp_path, data_dir):
    """As the official fine-tuning: pre_logits dropped, a new zero head, positions resized to the new grid."""
    import keras_vit
    from tests.layer_checks import randomize_weights
    from trainers import data, loop, recipes

    # A small "ImageNet-21k" file: class token, a tanh pre_logits layer, 50 classes, a 2x2 grid (4 px).
    pretrained = keras_vit.ViT(patch_size=2, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1,
                               input_shape=(4, 4, 1), classes=50, representation_size=32)
    randomize_weights(pretrained, scale=0.2)
    path = keras_vit.save_npz(pretrained, tmp_path / "i21k.npz")
    fields = dict(patch_size=2, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1, image_size=8,
                  pretrained=str(path), dataset="keras_vit_digits", train_split="train", eval_split="test")
    recipe = recipes.validate(recipes.RECIPES["vit_finetune"].replace(**fields))
    model = loop.build_model(recipe, data.load(recipe.dataset, "train", data_dir, 0))
    names = [layer.name for layer in model.layers]
    assert "pre_logits" not in names and model.output_shape == (None, 10)
    assert not model.get_layer("head").kernel.numpy().any()
    np.testing.assert_array_equal(model.get_layer("encoder_block_0").mlp.dense_1.kernel.numpy(),
                                  pretrained.get_layer("encoder_block_0").mlp.dense_1.kernel.numpy())
    assert model.get_layer("position_embedding").embedding.shape == (1, 1 + 16, 32)  # resized from 1 + 4
    flags = [f"--{name}={value}" for name, value in fields.items()]
    result = run(["trainers.train", "--recipe=vit_finetune", f"--model_dir={tmp_path / 'run'}",
                  f"--data_dir={data_dir}", *flags, "--batch_size=16", "--train_steps=10", "--warmup_steps=2",
                  "--steps_per_execution=5", "--jit_compile=false", "--checkpoint_every=10"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "pre_logits/kernel" not in final_weights(tmp_path / "run") and "test top-1" in result.stdout
    # The written .keras file carries its configuration: read back here, from the file the trainer's own process
    # wrote (a fresh process loading a model.keras is test_docs.py's).
    import keras

    config = keras.models.load_model(tmp_path / "run" / "model.keras").vit_config
    assert (config.image_size, config.classes, config.representation_size) == ((8, 8), 10, None)


# The distributed runs, in processes started together (each pays TensorFlow's import; tests/trainers/worker.py):
# the MirroredStrategy modes in two (each process splits the CPU into two logical devices before TensorFlow starts),
# and the two local workers of one MultiWorkerMirroredStrategy cluster.
DISTRIBUTED = {"tasks": ("deit", "mpp", "finetune"),
               "mirrored": ("mirrored_defaults", "indivisible", "one", "mirrored"),
               "worker0": ("multi_worker",), "worker1": ("multi_worker",)}


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def distributed_runs(tmp_path_factory, data_dir):
    """{process: (CompletedProcess, its OUT_DIR)} for DISTRIBUTED; the two workers share one OUT_DIR."""
    cluster = {"worker": [f"127.0.0.1:{_free_port()}", f"127.0.0.1:{_free_port()}"]}
    workers = tmp_path_factory.mktemp("multi_worker")
    outs = {name: workers if name.startswith("worker") else tmp_path_factory.mktemp(name) for name in DISTRIBUTED}
    envs = [{**ENV, "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": int(name[-1])}})}
            if name.startswith("worker") else ENV for name in DISTRIBUTED]
    results = run_together([[sys.executable, "-m", "tests.trainers.worker", str(outs[name]), data_dir, *modes]
                            for name, modes in DISTRIBUTED.items()], cwd=ROOT, envs=envs)
    return {name: (result, outs[name]) for name, result in zip(DISTRIBUTED, results, strict=True)}


def mode_output(distributed_runs, process, mode, output=None):
    """`(OUT_DIR, the mode's .npz, its lines of stderr)`; fails with the mode's error if it raised."""
    result, out = distributed_runs[process]
    output = output or mode
    error = out / f"{output}.error"
    assert not error.exists(), error.read_text()[-3000:]
    assert result.returncode == 0 and (out / f"{output}.npz").exists(), result.stderr[-3000:]
    lines = result.stderr.split(f"=== {mode}\n", 1)[1].split("\n=== ", 1)[0]
    return out, np.load(out / f"{output}.npz"), lines


@pytest.mark.slow
def test_mirrored_over_two_cpus_equals_one_device(distributed_runs):
    """Two replicas, each batch in two accumulated micro-batches, against one device's whole batches; layer decay
    and the EMA on in both (tests/trainers/worker.py)."""
    _, one, _ = mode_output(distributed_runs, "mirrored", "one")
    _, mirrored, _ = mode_output(distributed_runs, "mirrored", "mirrored")
    assert int(one["replicas"]) == 1 and int(mirrored["replicas"]) == 2
    weights = [k for k in one.files if k.startswith("w")]
    assert weights and weights == [k for k in mirrored.files if k.startswith("w")]
    for key in weights:
        np.testing.assert_allclose(one[key], mirrored[key], atol=2e-5, err_msg=key)
    for run in (one, mirrored):  # model.keras is the weight EMA's average (TINY's ema_decay), not the last weights
        assert run["saved_minus_average"] == 0 and run["saved_minus_trained"] > 1e-4


@pytest.mark.slow
def test_mirrored_with_the_recipes_defaults_and_xla_trains(distributed_runs):
    """XLA asked for (as `jit_compile="auto"` does on GPUs), and Keras 3 cannot compile one XLA cluster over two
    devices: the trainer turns it off."""
    out, defaults, lines = mode_output(distributed_runs, "mirrored", "mirrored_defaults")
    assert "XLA off under MirroredStrategy with 2 replicas" in lines
    assert int(defaults["replicas"]) == 2 and (out / "mirrored_defaults" / "model.npz").exists()


def test_a_batch_two_replicas_do_not_divide_stops_before_the_data(distributed_runs):
    """Under a real MirroredStrategy (it used to crash in an AddN op after the data and model were built)."""
    _, out = distributed_runs["mirrored"]
    error = (out / "indivisible.error").read_text()
    assert error.startswith("InvalidRun: `batch_size` must be a multiple of the 2 replicas in sync; received "
                            "batch_size=15"), error[-3000:]
    assert not (out / "indivisible").exists()  # neither its model_dir nor its data_dir: before the data


@pytest.mark.slow
def test_two_local_workers_train_together_and_agree(distributed_runs):
    _, a, _ = mode_output(distributed_runs, "worker0", "multi_worker", "multi_worker0")
    run_dir, b, _ = mode_output(distributed_runs, "worker1", "multi_worker", "multi_worker1")
    assert int(a["replicas"]) == int(b["replicas"]) == 2
    weights = [k for k in a.files if k.startswith("w")]
    assert weights
    for key in weights:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    run_dir = run_dir / "multi_worker"
    assert (run_dir / "model.npz").exists() and not (run_dir / "checkpoints_1").exists()
    assert json.loads((run_dir / "recipe.json").read_text())["train_steps"] == 20
    assert not list(run_dir.glob("*.tmp*")), "a temporary file was left behind"


@pytest.mark.slow
def test_deit_distillation_and_mpp_train_under_mirrored_strategy(distributed_runs):
    """Both tasks' losses fall over two logical CPUs; MPP's model.npz fine-tunes through the digits recipe."""
    for task in ("deit", "mpp"):
        out, output, _ = mode_output(distributed_runs, "tasks", task)
        assert int(output["replicas"]) == 2
        losses = [loss for _, loss in sorted(event_scalars(out / task / "logs" / "train")["epoch_loss"])]
        assert len(losses) == 4 and losses[-1] < 0.9 * losses[0], (task, losses)
    mode_output(distributed_runs, "tasks", "finetune")
    import keras

    import keras_vit  # noqa: F401 -- registers its layers for load_model

    deit = keras.models.load_model(out / "deit" / "model.keras")
    assert deit.vit_config.distilled and deit.get_layer("head_dist").kernel.shape == (32, 10)
    mpp_network = keras.models.load_model(out / "mpp" / "model.keras")
    assert mpp_network.get_layer("mpp_head").units == 8  # grey digits: 8 colour classes
    pretrained = final_weights(out / "mpp")
    assert "head/kernel" not in pretrained and not any(k.startswith("mpp") for k in pretrained)
    assert json.loads((out / "finetune" / "metrics.json").read_text())["step"] == 10
