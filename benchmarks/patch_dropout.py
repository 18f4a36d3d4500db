"""Training step time and peak memory of `patch_dropout` against the rate (issue 52's PatchDropout row).

PatchDropout (Liu et al., WACV 2023) runs the encoder blocks on the prefix
tokens and max(1, int(N (1 - rate))) of the N patches, so at rate 0.5 a
training step should take about half the time and activation memory.

Each measurement is a process of its own (peak memory is per process): it
builds the variant at `--patch_dropout=RATE` with AdamW, compiles the step as
the recipes do (`--jit_compile`), runs one step to compile, then `--steps`
timed steps on random data, and reports its peak resident memory
(`ru_maxrss`), its resident memory before the first step (weights built) and
seconds per step, wall and process CPU time (less disturbed by others' load).
Rounds take the rates in turn, each round starting with
numpy's GEMM rate so the machine's drift shows; each rate's ratios to rate 0
are taken within a round.

    python -m benchmarks.patch_dropout [--variant=B/16] [--batch=8] [--rates=0,0.25,0.5,0.75] [--rounds=3]
"""

import json
import os
import resource
import sys
import time

from absl import app, flags

from benchmarks import common

_VARIANT = flags.DEFINE_string("variant", "B/16", "ViT variant.")
_IMAGE_SIZE = flags.DEFINE_integer("image_size", 224, "Image size in pixels.")
_BATCH = flags.DEFINE_integer("batch", 8, "Batch size.")
_RATES = flags.DEFINE_list("rates", ["0", "0.25", "0.5", "0.75"], "patch_dropout rates; the first is the baseline.")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Rounds, each a fresh process per rate.")
_STEPS = flags.DEFINE_integer("steps", 3, "Timed steps per process (after one compiling step).")
_JIT = flags.DEFINE_bool("jit_compile", True, "Compile the step with XLA (the recipes' default on TPU and GPU).")
_OUT = flags.DEFINE_string("out", "benchmarks/results/patch_dropout_cpu.json", "Where to write the JSON.")
_WORKER = flags.DEFINE_float("worker", None, "Internal: measure this rate in this process and print JSON.")


def worker(rate):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np

    import keras_vit
    from keras_vit.layers.patch_dropout import num_kept

    keras.utils.set_random_seed(0)
    config = keras_vit.decode_variant(_VARIANT.value).replace(image_size=_IMAGE_SIZE.value, patch_dropout=rate)
    model = keras_vit.ViT(config, classes=1000, classifier_activation=None)
    model.compile(keras.optimizers.AdamW(1e-4), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=_JIT.value)
    x = np.random.default_rng(0).uniform(-1, 1, (_BATCH.value, *config.image_size, 3)).astype("float32")
    y = np.arange(_BATCH.value) % 1000
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    model.train_on_batch(x, y)
    first = time.perf_counter() - start
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(_STEPS.value):
        loss = model.train_on_batch(x, y)
    step = (time.perf_counter() - start) / _STEPS.value
    step_cpu = (time.process_time() - cpu) / _STEPS.value
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    patches = config.grid_size[0] * config.grid_size[1]
    kept = num_kept(patches, rate) if rate else patches
    print(json.dumps({"patch_dropout": rate, "tokens": config.num_prefix_tokens + kept,
                      "peak_rss_mb": peak / 1024, "rss_before_steps_mb": before / 1024, "first_step_s": first,
                      "step_s": step, "step_cpu_s": step_cpu, "loss": float(loss)}))


def measure(rate):
    return common.worker_json(
        [sys.executable, "-m", "benchmarks.patch_dropout", f"--worker={rate}", f"--variant={_VARIANT.value}",
         f"--image_size={_IMAGE_SIZE.value}", f"--batch={_BATCH.value}", f"--steps={_STEPS.value}",
         f"--jit_compile={_JIT.value}"], f"the patch_dropout={rate} worker")


def _ratios(run, baseline):
    """A rate's figures over the baseline's in the same round; the step's own memory is peak minus the RSS before
    the first step (weights and the process), what the rate can change."""
    def step_memory(r):
        return r["peak_rss_mb"] - r["rss_before_steps_mb"]

    return {"step_ratio": run["step_s"] / baseline["step_s"], "cpu_ratio": run["step_cpu_s"] / baseline["step_cpu_s"],
            "memory_ratio": run["peak_rss_mb"] / baseline["peak_rss_mb"],
            "step_memory_ratio": step_memory(run) / step_memory(baseline)}


def main(argv):
    del argv
    if _WORKER.value is not None:
        return worker(_WORKER.value)
    rates = [float(rate) for rate in _RATES.value]
    if rates[0] != 0.0:
        raise app.UsageError(f"--rates starts with the baseline, 0; received {_RATES.value}")
    started = time.perf_counter()
    rounds = []
    for index in range(_ROUNDS.value):
        gemm = common.gemm_gflops()
        runs = [measure(rate) for rate in rates]
        rounds.append({"gemm_gflops": gemm, "runs": runs, "ratios": [_ratios(run, runs[0]) for run in runs]})
        print(f"round {index}: GEMM {gemm:.0f} GFLOP/s; " + ", ".join(
            f"{run['patch_dropout']:g}: {run['step_s']:.2f} s ({ratio['step_ratio']:.2f}x, "
            f"CPU {ratio['cpu_ratio']:.2f}x), "
            f"{run['peak_rss_mb']:.0f} MB ({ratio['memory_ratio']:.2f}x)"
            for run, ratio in zip(runs, rounds[-1]["ratios"], strict=True)))
    results = summarize(rounds)
    fixed, per_token = _memory_line(results)
    common.write_json(_OUT.value, {
        "machine": common.machine(), "variant": _VARIANT.value, "image_size": _IMAGE_SIZE.value,
        "batch": _BATCH.value, "steps": _STEPS.value, "jit_compile": _JIT.value, "rounds": rounds,
        "results": results, "memory_fit": {"fixed_mb": fixed, "per_token_mb": per_token},
        "expected": "about half the step time and memory at rate 0.5",
        "wall_s": time.perf_counter() - started})
    common.print_table([{
        "rate": f"{r['patch_dropout']:g}", "tokens": r["tokens"], "step s": _spread(r["step_s"]),
        "step x": _spread(r["step_ratio"]), "CPU x": _spread(r["cpu_ratio"]),
        "peak MB": _spread(r["peak_rss_mb"], "{:.0f}"), "peak x": _spread(r["memory_ratio"]),
        "step memory x": _spread(r["step_memory_ratio"])} for r in results],
        ["rate", "tokens", "step s", "step x", "CPU x", "peak MB", "peak x", "step memory x"])
    print(f"peak memory ~ {fixed:.0f} MB + {per_token:.1f} MB per token (least squares); wrote {_OUT.value}")


def summarize(rounds):
    """Each rate's figures over the rounds (median, min, max); `cores_busy` is CPU time over wall time, how many of
    the machine's cores the step had (others' processes take some)."""
    results = []
    for position, run in enumerate(rounds[0]["runs"]):
        runs = [r["runs"][position] for r in rounds]
        ratios = [r["ratios"][position] for r in rounds]
        results.append({"patch_dropout": run["patch_dropout"], "tokens": run["tokens"],
                        "step_s": common.summarize([run["step_s"] for run in runs]),
                        "step_cpu_s": common.summarize([run["step_cpu_s"] for run in runs]),
                        "cores_busy": common.summarize([run["step_cpu_s"] / run["step_s"] for run in runs]),
                        "peak_rss_mb": common.summarize([run["peak_rss_mb"] for run in runs]),
                        "first_step_s": common.summarize([run["first_step_s"] for run in runs]),
                        **{name: common.summarize([ratio[name] for ratio in ratios])
                           for name in ("step_ratio", "cpu_ratio", "memory_ratio", "step_memory_ratio")}})
    return results


def _memory_line(results):
    """(fixed MB, MB per token): the least-squares line through each rate's median peak memory against its tokens,
    to tell the memory that does not scale with tokens (runtime, weights, gradients, AdamW's state) from what does."""
    import numpy as np

    tokens = [r["tokens"] for r in results]
    peaks = [r["peak_rss_mb"]["median"] for r in results]
    per_token, fixed = np.polyfit(tokens, peaks, 1)
    return float(fixed), float(per_token)


def _spread(summary, fmt="{:.2f}"):
    return f"{fmt.format(summary['median'])} ({fmt.format(summary['min'])}-{fmt.format(summary['max'])})"


if __name__ == "__main__":
    app.run(main)
