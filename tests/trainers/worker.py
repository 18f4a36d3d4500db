"""Runs tiny digits trainings in one process, for the distribution tests.

    python -m tests.trainers.worker OUT_DIR DATA_DIR MODE [MODE ...]

Each MODE trains in OUT_DIR/MODE (its model_dir) and writes OUT_DIR/MODE.npz (multi_worker: MODE followed by
the worker's task index): the replicas in sync and, for
one|mirrored|multi_worker, the final weights. A mode that raises writes OUT_DIR/MODE.error instead (its type and
message on the first line, then the traceback) and the next mode runs. Each mode's lines on stderr follow a line
"=== MODE".

    mirrored_defaults  the digits recipe's own settings with XLA asked for (a GPU's default), under MirroredStrategy
    indivisible        batch_size=15 under MirroredStrategy (2 replicas), with OUT_DIR/indivisible/tfds for data
    deit, mpp          the distilled DeiT (an untrained MobileNetV3Small teacher) and the MPP task, under
                       MirroredStrategy; evaluations only at the end
    finetune           the digits recipe from mpp's model.npz, 10 steps on the default strategy
    one, mirrored      deterministic: the default strategy against MirroredStrategy with two accumulated
                       micro-batches per step, clipped steps over two chunks
    multi_worker       MultiWorkerMirroredStrategy from TF_CONFIG (alone: it must be made before TensorFlow starts)

MirroredStrategy runs over two logical CPUs: the CPU is split before TensorFlow starts, hence a process of its own
(one process for several modes: each fresh one pays TensorFlow's import). Op determinism cannot be turned off once
on, so the modes run in the order above whatever the order given: one and mirrored last.
"""

import json
import os
import pathlib
import sys
import traceback

import keras
import numpy as np
import tensorflow as tf

import keras_vit
from trainers import loop, train
from trainers.strategy import make_strategy

MODES = ("mirrored_defaults", "indivisible", "deit", "mpp", "finetune", "one", "mirrored", "multi_worker")
# The clip binds (the first gradients' norm is about 0.35): replicas must clip their summed gradient.
# Layer decay and the EMA ride along: their updates and the average's swap run under each strategy.
TINY = dict(hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1, batch_size=16, train_steps=20,
            checkpoint_every=10, steps_per_execution=5, warmup_steps=5, grad_clip_norm=0.1, layer_decay=0.75,
            ema_decay=0.9)
# The single-process modes need a few clipped steps over two chunks (a checkpoint between), not 20: one device
# against two compares weights after them, the defaults' run shows XLA turned off and training going.
SHORT = dict(train_steps=10, checkpoint_every=5)
# DeiT and MPP: four chunks of 5 steps (four epoch_loss points).
TASK = dict(hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1, batch_size=16, train_steps=20,
            checkpoint_every=5, steps_per_execution=5, warmup_steps=5)
DIGITS = dict(dataset="keras_vit_digits", eval_split="test", patch_size=2, image_size=8, train_crop="resize",
              flip=False, eval_crop_fraction=1.0, mixed_precision="float32", optimizer="adamw", learning_rate=2e-3)


def run_mode(mode, out, data_dir, mirrored):
    model_dir = out / mode  # multi_worker: the workers' shared one
    if mode == "mirrored_defaults":  # nothing deterministic
        recipe = train.resolve_recipe("digits", {**TINY, **SHORT, "jit_compile": "true"})
        loop.train(recipe, model_dir, mirrored, "cpu", data_dir)
        return {"replicas": mirrored.num_replicas_in_sync}
    if mode == "indivisible":  # refused before the data: the test reads that neither folder exists
        recipe = train.resolve_recipe("digits", {**TINY, **SHORT, "jit_compile": "false", "batch_size": 15})
        loop.train(recipe, model_dir / "run", mirrored, "cpu", str(model_dir / "tfds"))
        return {"replicas": mirrored.num_replicas_in_sync}
    if mode == "deit":
        teacher = keras.applications.MobileNetV3Small(input_shape=(32, 32, 3), weights=None, classes=10,
                                                      minimalistic=True, include_preprocessing=True)
        teacher.save(out / "teacher.keras")
        recipe = train.resolve_recipe("digits", {**TASK, "classifier": "token", "distilled": True,
                                                 "distillation": "hard", "teacher": str(out / "teacher.keras")})
        loop.train(recipe, model_dir, mirrored, "cpu", data_dir, eval_every=0)
        return {"replicas": mirrored.num_replicas_in_sync}
    if mode == "mpp":
        recipe = train.resolve_recipe("mpp_pretrain", {**TASK, **DIGITS, "classifier": "gap", "learning_rate": 5e-3})
        loop.train(recipe, model_dir, mirrored, "cpu", data_dir, eval_every=0)
        return {"replicas": mirrored.num_replicas_in_sync}
    if mode == "finetune":
        recipe = train.resolve_recipe("digits", {**TASK, "train_steps": 10, "checkpoint_every": 10,
                                                 "pretrained": str(out / "mpp" / "model.npz")})
        loop.train(recipe, model_dir, tf.distribute.get_strategy(), "cpu", data_dir)
        return {"replicas": 1}
    if mode == "multi_worker":
        strategy, _ = make_strategy("multi_worker")
        short = {}  # the 20 steps its test reads
    else:
        strategy = mirrored if mode == "mirrored" else tf.distribute.get_strategy()
        short = SHORT
    tf.config.experimental.enable_op_determinism()
    # Two replicas, each batch in two accumulated micro-batches: the same updates as one device's whole batches.
    accumulated = {"grad_accumulation_steps": 2} if mode == "mirrored" else {}
    recipe = train.resolve_recipe("digits", {**TINY, **short, **accumulated, "jit_compile": "false"})
    model, _ = loop.train(recipe, model_dir, strategy, "cpu", data_dir)
    weights = {"replicas": strategy.num_replicas_in_sync, **{f"w{i}": w for i, w in enumerate(model.get_weights())}}
    if mode == "multi_worker":  # only the chief writes model.keras
        return weights
    # model.keras holds the EMA's average (the optimiser's), not the trained weights the model is left with.
    saved = keras_vit.load_model(model_dir / "model.keras").trainable_weights
    averages = [keras.ops.convert_to_numpy(a) for a in model.optimizer._model_variables_moving_average]
    trained = [keras.ops.convert_to_numpy(w) for w in model.trainable_weights]
    return {**weights, "saved_minus_average": max(np.abs(s - a).max() for s, a in zip(saved, averages, strict=True)),
            "saved_minus_trained": max(np.abs(s - t).max() for s, t in zip(saved, trained, strict=True))}


def _two_cpus():
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def main(out, data_dir, *modes):
    unknown = set(modes) - set(MODES)
    if unknown or not modes or ("multi_worker" in modes and len(modes) > 1):
        raise SystemExit(f"modes: one or more of {MODES} (multi_worker alone); received {modes}")
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    mirrored = None if modes == ("multi_worker",) or modes == ("one",) else _two_cpus()
    for mode in sorted(modes, key=MODES.index):
        print(f"=== {mode}", file=sys.stderr, flush=True)
        # Workers share OUT_DIR: each its own file, by its task index.
        name = f"{mode}{json.loads(os.environ['TF_CONFIG'])['task']['index']}" if mode == "multi_worker" else mode
        keras.backend.clear_session()  # as a fresh process: no names, graphs or policy left from the last mode
        try:
            np.savez(out / f"{name}.npz", **run_mode(mode, out, data_dir, mirrored))
        except Exception as error:  # noqa: BLE001 -- reported to the test, which names it
            (out / f"{name}.error").write_text(f"{type(error).__name__}: {error}\n{traceback.format_exc()}")
        sys.stderr.flush()


if __name__ == "__main__":
    main(*sys.argv[1:])
