"""CPU inference of rotary-position models against the same model with a learned table (the rotary issue's row).

The rotation is elementwise (slices, multiplies, a concatenation), so a RoPE model must answer within 10% of
the same variant with a learned table: `position_embedding="learned_1d"` is the baseline; beside it each
rotary kind as its family builds it: rope_axial, rope_mixed and rope_dinov3 alone (`position_embedding="none"`),
rope_eva beside the learned table (EVA02), and rope_dinov3 with `dynamic_image_size=True` (coordinates computed
in the graph from the run-time grid). Every model runs as `benchmarks.run`'s "keras_vit graph" inference does:
`tf.function(model)` called on the images (Keras' `jit_compile="auto"` is off on a CPU; `--jit_compile` asks
for XLA instead), the answer fetched as numpy.

Steady time: one process holds every model; each round starts with numpy's GEMM rate so the machine's drift
shows, then the models take turns call by call (`--calls` timed turns; a model's figure for the round is the
median of its calls, wall and process CPU time), and each model's ratio to the baseline is taken within a round.
`--without_rotation=KIND,...` adds diagnosis rows: the rotary model traced with each block's rotation skipped.
First call: each model in a fresh process, timed from the model's build through the trace to the first answer (build_s,
trace_and_first_s, total_s), the processes alternating in the same order.

    python -m benchmarks.rope_inference [--variant=S/16] [--batch=8] [--rounds=3] [--calls=5] [--jit_compile]
"""

import contextlib
import json
import os
import statistics
import sys
import time

from absl import app, flags

from benchmarks import common

# name: (position_embedding, rotary_embedding, dynamic_image_size); the first is the baseline.
MODELS = {
    "learned_1d": ("learned_1d", None, False),
    "rope_axial": ("none", "rope_axial", False),
    "rope_mixed": ("none", "rope_mixed", False),
    "rope_eva": ("learned_1d", "rope_eva", False),
    "rope_dinov3": ("none", "rope_dinov3", False),
    "rope_dinov3 dynamic": ("none", "rope_dinov3", True),
}
BASELINE = "learned_1d"
NO_ROTATION = ", no rotation"
TARGET = 1.10

_VARIANT = flags.DEFINE_string("variant", "S/16", "ViT variant.")
_IMAGE_SIZE = flags.DEFINE_integer("image_size", 224, "Image size in pixels.")
_BATCH = flags.DEFINE_integer("batch", 8, "Batch size.")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Alternating rounds of the steady timing (and fresh first-call processes "
                               "per model).")
_CALLS = flags.DEFINE_integer("calls", 5, "Timed calls per model and round, the models taking turns.")
_THREADS = flags.DEFINE_integer("threads", 2, "TensorFlow's intra-op threads.")
_JIT = flags.DEFINE_bool("jit_compile", False, "Compile with XLA (default: the TF graph, Keras' default on a CPU).")
_MODELS = flags.DEFINE_list("models", list(MODELS), "Which models (the baseline always runs).")
_OUT = flags.DEFINE_string("out", "benchmarks/results/rope_inference_cpu.json", "Where to write the JSON.")
_WITHOUT_ROTATION = flags.DEFINE_list(
    "without_rotation", [], "Diagnosis: also time these rotary models with the rotation skipped (each block's "
    "`rotary.rotate` an identity while traced), named 'NAME, no rotation', in the same rounds (no first call).")
_FIRST_CALL = flags.DEFINE_string("first_call", None, "Internal: time one model's first call in this process, "
                                  "print JSON.")


def _setup():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(_THREADS.value)
    tf.config.threading.set_inter_op_parallelism_threads(_THREADS.value)


def build(name):
    """The model `name` of MODELS and its forward pass as `benchmarks.run`'s keras_vit side runs it."""
    import keras
    import tensorflow as tf

    import keras_vit

    position, rotary, dynamic = MODELS[name.removesuffix(NO_ROTATION)]
    config = keras_vit.decode_variant(_VARIANT.value).replace(
        image_size=_IMAGE_SIZE.value, position_embedding=position, rotary_embedding=rotary,
        dynamic_image_size=dynamic)
    keras.utils.set_random_seed(0)
    model = keras_vit.ViT(config, classes=1000, classifier_activation=None)
    return model, tf.function(model, jit_compile=_JIT.value)


def _images():
    import numpy as np

    size = _IMAGE_SIZE.value
    return np.random.default_rng(0).uniform(-1, 1, (_BATCH.value, size, size, 3)).astype("float32")


def first_call(name):
    """Build + trace + first answer of one model in this (fresh) process; prints JSON."""
    start = time.perf_counter()
    _setup()
    import tensorflow as tf

    images = tf.constant(_images())
    imported = time.perf_counter()
    _, forward = build(name)
    built = time.perf_counter()
    forward(images).numpy()
    answered = time.perf_counter()
    print(json.dumps({"model": name, "import_s": imported - start, "build_s": built - imported,
                      "trace_and_first_s": answered - built, "total_s": answered - imported}))


def measure_first_call(name):
    return common.worker_json(
        [sys.executable, "-m", "benchmarks.rope_inference", f"--first_call={name}", f"--variant={_VARIANT.value}",
         f"--image_size={_IMAGE_SIZE.value}", f"--batch={_BATCH.value}", f"--threads={_THREADS.value}",
         f"--jit_compile={_JIT.value}"], f"the first call of {name}")


def steady(names):
    """{name: [(wall, CPU) seconds per call, per round]}, [GEMM GFLOP/s per round]: every model in this process.

    The machine is shared and its speed drifts within seconds, so within a round the models take turns call by
    call (`--calls` turns, after a warm-up turn); a model's figure for the round is the median of its calls.
    """
    _setup()
    import tensorflow as tf

    images = tf.constant(_images())
    calls = {}
    for name in names:
        _, forward = build(name)
        with _rotation_skipped(name.endswith(NO_ROTATION)):
            forward(images).numpy()  # trace
        calls[name] = lambda forward=forward: forward(images).numpy()
    samples, gemms = {name: [] for name in names}, []
    for _ in range(_ROUNDS.value):
        gemms.append(common.gemm_gflops())
        timed = {name: [] for name in names}
        for turn in range(_CALLS.value + 1):
            for name, call in calls.items():
                wall, cpu = time.perf_counter(), time.process_time()
                call()
                if turn:  # the first turn warms caches after the GEMM
                    timed[name].append((time.perf_counter() - wall, time.process_time() - cpu))
        for name, pairs in timed.items():
            samples[name].append(tuple(statistics.median(column) for column in zip(*pairs, strict=True)))
    return samples, gemms


@contextlib.contextmanager
def _rotation_skipped(skip):
    """While tracing, `keras_vit.positions.rotary.rotate` leaves its input as it is (a diagnosis: what the rest of
    the rotary model costs)."""
    from keras_vit.positions import rotary

    rotate = rotary.rotate
    if skip:
        rotary.rotate = lambda name, x, cos, sin: x
    try:
        yield
    finally:
        rotary.rotate = rotate


def main(argv):
    del argv
    if _FIRST_CALL.value:
        return first_call(_FIRST_CALL.value)
    names = [BASELINE] + [n for n in _MODELS.value if n != BASELINE]
    unknown = set(names) - set(MODELS)
    if unknown:
        raise app.UsageError(f"unknown models {sorted(unknown)}; known: {', '.join(MODELS)}")
    started = time.perf_counter()
    firsts = {name: [] for name in names}
    first_gemm = []
    for _ in range(_ROUNDS.value):
        first_gemm.append(common.gemm_gflops())
        for name in names:
            firsts[name].append(measure_first_call(name))
    diagnosed = [n + NO_ROTATION for n in _WITHOUT_ROTATION.value]
    if set(_WITHOUT_ROTATION.value) - {n for n in names if MODELS[n][1]}:
        raise app.UsageError(f"--without_rotation takes rotary models of --models; received {_WITHOUT_ROTATION.value}")
    seconds, gemms = steady(names + diagnosed)
    rounds = []
    for index, gemm in enumerate(gemms):
        wall = {n: seconds[n][index][0] for n in seconds}
        cpu = {n: seconds[n][index][1] for n in seconds}
        rounds.append({"gemm_gflops": gemm, "seconds": wall, "cpu_seconds": cpu,
                       "ratio": {n: wall[n] / wall[BASELINE] for n in seconds},
                       "cpu_ratio": {n: cpu[n] / cpu[BASELINE] for n in seconds}})
        print(f"round {index}: GEMM {gemm:.0f} GFLOP/s; " + ", ".join(
            f"{n} {wall[n] * 1e3:.0f} ms ({rounds[-1]['ratio'][n]:.2f}x, CPU {rounds[-1]['cpu_ratio'][n]:.2f}x)"
            for n in seconds))

    def steady_figures(name):
        return {"ms": common.summarize([r["seconds"][name] * 1e3 for r in rounds]),
                "ratio": common.summarize([r["ratio"][name] for r in rounds]),
                "cpu_ms": common.summarize([r["cpu_seconds"][name] * 1e3 for r in rounds]),
                "cpu_ratio": common.summarize([r["cpu_ratio"][name] for r in rounds]),
                "images_per_s": common.summarize([_BATCH.value / r["seconds"][name] for r in rounds])}

    results = []
    for name in names:
        position, rotary, dynamic = MODELS[name]
        totals = [f["total_s"] for f in firsts[name]]
        base_totals = [f["total_s"] for f in firsts[BASELINE]]
        figures = steady_figures(name)
        results.append({
            "model": name, "position_embedding": position, "rotary_embedding": rotary, "dynamic_image_size": dynamic,
            **figures,
            "first_call_s": common.summarize(totals),
            "first_call_ratio": common.summarize([t / b for t, b in zip(totals, base_totals, strict=True)]),
            "first_call_stages": firsts[name],
            "met": name == BASELINE or figures["ratio"]["median"] <= TARGET})
    for name in diagnosed:
        position, rotary, dynamic = MODELS[name.removesuffix(NO_ROTATION)]
        results.append({"model": name, "position_embedding": position, "rotary_embedding": rotary,
                        "dynamic_image_size": dynamic, "diagnosis": True, **steady_figures(name)})
    measured = [r for r in results if not r.get("diagnosis")]
    summary = {"met": all(r["met"] for r in measured),
               "worst_median_ratio": max(r["ratio"]["median"] for r in measured if r["model"] != BASELINE)}
    common.write_json(_OUT.value, {
        "machine": common.machine(), "variant": _VARIANT.value, "image_size": _IMAGE_SIZE.value,
        "batch": _BATCH.value, "rounds": _ROUNDS.value, "calls": _CALLS.value, "threads": _THREADS.value,
        "jit_compile": _JIT.value, "form": "tf.function(model, jit_compile=%s)" % _JIT.value,
        "first_call_gemm_gflops": first_gemm, "steady_rounds": rounds, "results": results, "summary": summary,
        "target": f"steady inference <= {TARGET:.2f}x the learned_1d model's", "wall_s": time.perf_counter() - started})
    common.print_table([{
        "model": r["model"], "ms": _spread(r["ms"], "{:.0f}"), "x learned_1d": _spread(r["ratio"]),
        "CPU x": _spread(r["cpu_ratio"]),
        "first call s": _spread(r["first_call_s"], "{:.1f}") if "first_call_s" in r else "-",
        "first x": _spread(r["first_call_ratio"]) if "first_call_ratio" in r else "-",
        "met": "-" if r["model"] == BASELINE or "met" not in r else ("yes" if r["met"] else "no")} for r in results],
        ["model", "ms", "x learned_1d", "CPU x", "first call s", "first x", "met"])
    print(f"target <= {TARGET:.2f}x: {'met' if summary['met'] else 'not met'}; wrote {_OUT.value}")


def _spread(summary, fmt="{:.2f}"):
    return f"{fmt.format(summary['median'])} ({fmt.format(summary['min'])}-{fmt.format(summary['max'])})"


if __name__ == "__main__":
    app.run(main)
