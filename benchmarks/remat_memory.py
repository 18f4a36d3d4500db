"""Training memory and step time of `remat=True` against the same model without it (issue 18's row).

Each measurement is a process of its own (peak memory is per process): it
builds the variant with AdamW, compiles the step as the recipes do
(`--jit_compile`), runs one step to compile, then `--steps` timed steps on
random data, and reports its peak resident memory (`ru_maxrss`) and seconds
per step. Rounds alternate the two settings, each round starting with numpy's
GEMM rate so the machine's drift shows; the ratios are taken within a round.

    python -m benchmarks.remat_memory [--variant=B/16] [--batch=32] [--rounds=2] [--steps=2]
"""

import json
import os
import resource
import sys
import time

from absl import app, flags

from benchmarks import common

_VARIANT = flags.DEFINE_string("variant", "B/16", "ViT variant.")
_BATCH = flags.DEFINE_integer("batch", 32, "Batch size.")
_ROUNDS = flags.DEFINE_integer("rounds", 2, "Alternating rounds.")
_STEPS = flags.DEFINE_integer("steps", 2, "Timed steps per process (after one compiling step).")
_JIT = flags.DEFINE_bool("jit_compile", True, "Compile the step with XLA (the recipes' default on TPU and GPU).")
_OUT = flags.DEFINE_string("out", "benchmarks/results/remat_memory_cpu.json", "Where to write the JSON.")
_WORKER = flags.DEFINE_bool("worker", False, "Internal: measure one setting and print JSON.")
_REMAT = flags.DEFINE_bool("remat", False, "Internal: the worker's setting.")


def worker():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np

    import keras_vit

    keras.utils.set_random_seed(0)
    model = keras_vit.ViT(keras_vit.decode_variant(_VARIANT.value), remat=_REMAT.value, classes=1000,
                          classifier_activation=None)
    model.compile(keras.optimizers.AdamW(1e-4), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=_JIT.value)
    size = model.vit_config.image_size
    x = np.random.default_rng(0).uniform(-1, 1, (_BATCH.value, *size, 3)).astype("float32")
    y = np.arange(_BATCH.value) % 1000
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    model.train_on_batch(x, y)
    first = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(_STEPS.value):
        loss = model.train_on_batch(x, y)
    step = (time.perf_counter() - start) / _STEPS.value
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"remat": _REMAT.value, "peak_rss_mb": peak / 1024, "rss_before_steps_mb": before / 1024,
                      "first_step_s": first, "step_s": step, "loss": float(loss)}))


def measure(remat):
    return common.worker_json(
        [sys.executable, "-m", "benchmarks.remat_memory", "--worker", f"--remat={remat}", f"--variant={_VARIANT.value}",
         f"--batch={_BATCH.value}", f"--steps={_STEPS.value}", f"--jit_compile={_JIT.value}"],
        f"the remat={remat} worker")


def main(argv):
    del argv
    if _WORKER.value:
        return worker()
    rounds = []
    for index in range(_ROUNDS.value):
        gemm = common.gemm_gflops()
        plain, remat = measure(False), measure(True)
        rounds.append({"gemm_gflops": gemm, "plain": plain, "remat": remat,
                       "memory_ratio": remat["peak_rss_mb"] / plain["peak_rss_mb"],
                       "step_ratio": remat["step_s"] / plain["step_s"]})
        print(f"round {index}: peak RSS {plain['peak_rss_mb']:.0f} -> {remat['peak_rss_mb']:.0f} MB "
              f"({rounds[-1]['memory_ratio']:.2f}x), step {plain['step_s']:.1f} -> {remat['step_s']:.1f} s "
              f"({rounds[-1]['step_ratio']:.2f}x); GEMM {gemm:.0f} GFLOP/s")
    summary = {name: common.summarize([r[name] for r in rounds]) for name in ("memory_ratio", "step_ratio")}
    summary["met"] = summary["memory_ratio"]["max"] <= 0.6 and summary["step_ratio"]["max"] <= 1.35
    common.write_json(_OUT.value, {"machine": common.machine(), "variant": _VARIANT.value, "batch": _BATCH.value,
                                   "steps": _STEPS.value, "jit_compile": _JIT.value, "rounds": rounds,
                                   "summary": summary, "target": "memory <= 0.6x at step time <= 1.35x"})
    print(f"memory {summary['memory_ratio']['median']:.2f}x, step time {summary['step_ratio']['median']:.2f}x "
          f"(target <= 0.6x at <= 1.35x: {'met' if summary['met'] else 'not met'}); wrote {_OUT.value}")


if __name__ == "__main__":
    app.run(main)
