"""Training throughput on this machine, and the README's main job.

1. Training images/s (forward, backward, AdamW step) of ViT-Ti/16 and S/16 at
   224 px, batch 16, XLA on and off, alternating rounds, each round also
   timing a float32 GEMM: figures are reported as a fraction of it, with the
   analytic FLOPs of a training step (3 x forward).
2. The README's main command (`python -m trainers.train` on the embedded
   digits) in a fresh model_dir: its test accuracy and wall time.

    python -m benchmarks.training [--variants=Ti/16,S/16] [--batch=16] [--rounds=3]
        [--skip_digits] [--out=benchmarks/results/training_cpu.json]
"""

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags  # noqa: E402

import keras_vit  # noqa: E402
from benchmarks import common  # noqa: E402

_VARIANTS = flags.DEFINE_list("variants", ["Ti/16", "S/16"], "ViT variants to train.")
_BATCH = flags.DEFINE_integer("batch", 16, "Batch size.")
_IMAGE_SIZE = flags.DEFINE_integer("image_size", 224, "Square resolution.")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Alternating timing rounds.")
_SECONDS = flags.DEFINE_float("seconds", 3.0, "Seconds of steps per round and mode.")
_SKIP_DIGITS = flags.DEFINE_bool("skip_digits", False, "Skip timing the README's main job.")
_OUT = flags.DEFINE_string("out", "benchmarks/results/training_cpu.json", "Where to write the JSON.")


def measure(variant, batch, image_size, rounds, seconds):
    fields = keras_vit.decode_variant(variant)
    images = np.random.default_rng(0).uniform(-1, 1, (batch, image_size, image_size, 3)).astype("float32")
    labels = np.arange(batch) % 1000
    flops = 3 * common.vit_forward_flops(image_size, **fields) * batch
    models, first_step = {}, {}
    for mode, jit in (("xla_off", False), ("xla_on", True)):
        model = keras_vit.ViT(**fields, image_size=image_size, classifier_activation=None)
        model.compile(optimizer=keras.optimizers.AdamW(1e-4), jit_compile=jit,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        start = time.perf_counter()
        model.train_on_batch(images, labels)
        first_step[mode] = time.perf_counter() - start
        models[mode] = model
    calls = {mode: (lambda m=model: m.train_on_batch(images, labels)) for mode, model in models.items()}
    result = {"variant": variant, "batch": batch, "image_size": image_size, "gflop_per_step": flops / 1e9,
              **common.alternate_rounds(calls, batch, flops, rounds, seconds)}
    for mode in models:
        result[mode]["first_step_s"] = first_step[mode]
    return result


def digits_main_job():
    """Runs the README's main command in a fresh model_dir; returns accuracy and wall time."""
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "trainers.train", f"--model_dir={folder}/digits"],
                       check=True, capture_output=True)
        wall = time.perf_counter() - start
        metrics = json.loads((pathlib.Path(folder) / "digits" / "metrics.json").read_text())
    return {"test_top1": metrics["eval_top1"], "wall_s": wall, "steps": metrics["step"]}


def main(argv):
    del argv
    results = [measure(v, _BATCH.value, _IMAGE_SIZE.value, _ROUNDS.value, _SECONDS.value) for v in _VARIANTS.value]
    rows = common.xla_rows(results, "first_step_s", "first step s")
    common.print_table(rows, list(rows[0]))
    payload = {"machine": common.machine(), "tensorflow": tf.__version__, "results": results}
    if not _SKIP_DIGITS.value:
        payload["digits_main_job"] = digits_main_job()
        d = payload["digits_main_job"]
        print(f"README main job: test top-1 {d['test_top1']:.4f} in {d['wall_s']:.0f} s ({d['steps']} steps)")
    common.write_json(_OUT.value, payload)
    print(f"wrote {_OUT.value}")


if __name__ == "__main__":
    app.run(main)
