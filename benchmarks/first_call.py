"""The first training call on Keras' own path, split by stage, each variant in a fresh process (issue 44).

What a Keras user writes: `keras_vit.ViT_S16(weights=None)`, `compile("adamw", SparseCategoricalCrossentropy)`
with Keras' default `jit_compile` (the TF graph on a CPU), then `train_on_batch`. Stages: build (the model),
compile, trace (until Keras' traced `train_step` returns), first run (the rest of the first `train_on_batch`:
graph optimisation, executor set-up and the step itself), steady (a later step); total is build to the end of
the first step. Beside it, the same with a `keras.optimizers.AdamW()` instance (which `compile` gives the fused
update in place) and timm's first training step in its own environment (`benchmarks.run.probe`). numpy's GEMM
rate is timed in the same run, before each variant's processes, so the figures can be read against the machine;
the keras_vit rows also record each stage's CPU seconds (`cpu_s`), which others' load on a shared machine
disturbs less than wall time.

    python -m benchmarks.first_call [--variants=S/16,B/16] [--tiny] [--max_isa=AVX2]
        [--out=benchmarks/results/first_call_cpu.json]
"""

import json
import os
import sys
import time

from absl import app, flags

from benchmarks import common, run

_VARIANTS = flags.DEFINE_list("variants", ["S/16", "B/16"], "ViT variants, each a keras_vit.ViT_XX builder.")
_BATCH = flags.DEFINE_integer("batch", 16, "Training batch.")
_THREADS = flags.DEFINE_integer("threads", 2, "Intra-op threads of every process.")
_STEADY_STEPS = flags.DEFINE_integer("steady_steps", 3, "Steps timed after the first (the median is reported).")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Fresh processes per row, the rows alternating; median (min-max).")
_TINY = flags.DEFINE_bool("tiny", False, "A 1-layer model at 32 px: checks the machinery in seconds (tests).")
_MAX_ISA = flags.DEFINE_enum(
    "max_isa", None, ["AVX2"],
    "Hold every framework to this instruction set (oneDNN, XLA and PyTorch's dispatch): an AVX2 CPU approximated on "
    "an AVX-512 one. The JSON's machine records it.")
_OUT = flags.DEFINE_string("out", "benchmarks/results/first_call_cpu.json", "Where to write the JSON.")
_TIMM_PYTHON = flags.DEFINE_string("timm_python", None, "Python of timm's environment (default: made on first use).")
_WORKER = flags.DEFINE_string("worker", None, "Internal: measure one variant in this process and print JSON.")
# Not --optimizer: the trainer's flag of that name shares absl's registry in one test process.
_COMPILE_WITH = flags.DEFINE_enum(
    "compile_with", "string", ["string", "instance"],
    "Internal: compile with the string 'adamw' or a keras.optimizers.AdamW() instance.")

# What each keras_vit row compiles with, and its label in the table.
OPTIMIZERS = {"string": 'compile("adamw")', "instance": "compile(keras.optimizers.AdamW())"}
STAGES = ("build_s", "compile_s", "trace_s", "first_run_s", "total_s", "steady_s")


def shape():
    """(image size, layers or None for the variant's own) of this run."""
    return (32, 1) if _TINY.value else (224, None)


def worker(variant):
    """One variant on Keras' own path in this (fresh) process; prints its stages as JSON."""
    start = time.perf_counter()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np
    import tensorflow as tf

    import keras_vit  # first, as docs/performance.md says: it turns TensorFlow's oneDNN kernels on before TF loads

    tf.config.threading.set_intra_op_parallelism_threads(_THREADS.value)
    image_size, num_layers = shape()
    images = np.random.default_rng(0).uniform(-1, 1, (_BATCH.value, image_size, image_size, 3)).astype("float32")
    labels = np.arange(_BATCH.value) % 1000
    imported = time.perf_counter()
    cpu = {"imported": time.process_time()}

    builder = getattr(keras_vit, "ViT_" + variant.replace("/", ""))
    model = builder(weights=None, **({"image_size": image_size, "num_layers": num_layers} if num_layers else {}))
    built = time.perf_counter()
    cpu["built"] = time.process_time()
    optimizer = "adamw" if _COMPILE_WITH.value == "string" else keras.optimizers.AdamW()
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy())
    compiled = time.perf_counter()
    cpu["compiled"] = time.process_time()

    traced = []
    train_step = model.train_step

    def timed_train_step(data):  # Python runs it only while tracing: its return ends the trace
        outputs = train_step(data)
        traced.append(time.perf_counter())
        cpu["traced"] = time.process_time()
        return outputs

    model.train_step = timed_train_step
    model.train_on_batch(images, labels)
    first = time.perf_counter()
    cpu["first"] = time.process_time()
    steady = []
    for _ in range(_STEADY_STEPS.value):
        step_start = time.perf_counter()
        model.train_on_batch(images, labels)
        steady.append(time.perf_counter() - step_start)
    if len(traced) != 1:
        raise RuntimeError(f"Keras traced the training step {len(traced)} times; the stages assume once")
    print(json.dumps({
        "import_s": imported - start, "build_s": built - imported, "compile_s": compiled - built,
        "trace_s": traced[0] - compiled, "first_run_s": first - traced[0], "total_s": first - imported,
        "steady_s": float(np.median(steady)), "optimizer": type(model.optimizer).__module__ + "."
        + type(model.optimizer).__name__, "trainable_variables": len(model.trainable_variables),
        # The process's CPU seconds per stage: steadier than wall time where others share the machine.
        "cpu_s": {"build_s": cpu["built"] - cpu["imported"], "compile_s": cpu["compiled"] - cpu["built"],
                  "trace_s": cpu["traced"] - cpu["compiled"], "first_run_s": cpu["first"] - cpu["traced"],
                  "total_s": cpu["first"] - cpu["imported"]}}))


def measure_keras_vit(variant, optimizer):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3",
           **{name: str(_THREADS.value) for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}}
    command = [sys.executable, "-m", "benchmarks.first_call", f"--worker={variant}", f"--compile_with={optimizer}",
               f"--batch={_BATCH.value}", f"--threads={_THREADS.value}", f"--steady_steps={_STEADY_STEPS.value}",
               f"--tiny={_TINY.value}"]
    return common.worker_json(command, f"the {variant} {optimizer} process", env=env, cwd=run.ROOT)


def measure_timm(python, variant):
    """timm's first training step (model build and first call), as benchmarks.run's probes take it."""
    image_size, num_layers = shape()
    probed = run.probe(python, "timm", _THREADS.value, task="training", variant=variant, batch=_BATCH.value,
                       image_size=image_size, precision="float32", num_layers=num_layers, compiled=False)
    return {"total_s": probed["build_and_first_call_s"], "first_run_s": probed["first_call_s"],
            "build_s": probed["build_and_first_call_s"] - probed["first_call_s"], "steady_s": probed["steady_call_s"]}


def main(argv):
    del argv
    if _WORKER.value:
        worker(_WORKER.value)
        return
    if _MAX_ISA.value:  # read by each framework as it loads: every process below inherits them
        os.environ.update(common.isa_limits(_MAX_ISA.value))
    timm_python = run.environment_python("timm", _TIMM_PYTHON.value, run.ENVS_DIR)
    results = []
    for variant in _VARIANTS.value:
        gemm, repeats = [], []
        for _ in range(_REPEATS.value):  # each repeat runs every row once, so drift falls on all of them
            gemm.append(common.gemm_gflops(seconds=0.1 if _TINY.value else 1.0))
            rows = {label: measure_keras_vit(variant, key) for key, label in OPTIMIZERS.items()}
            rows["timm"] = measure_timm(timm_python, variant)
            repeats.append(rows)
        results.append(summarize(variant, gemm, repeats))
    image_size, num_layers = shape()
    payload = {"machine": common.machine(), "settings": {"batch": _BATCH.value, "image_size": image_size,
                                                         "num_layers": num_layers, "threads": _THREADS.value,
                                                         "steady_steps": _STEADY_STEPS.value,
                                                         "repeats": _REPEATS.value},
               "results": results}
    print_table(results)
    common.write_json(_OUT.value, payload)
    print(f"wrote {_OUT.value}")


def summarize(variant, gemm, repeats):
    """One variant's result: its runs (`repeats`, a dict of rows each), each stage's median and range over them,
    and the ratios paired within each run."""
    fused, instance = OPTIMIZERS["string"], OPTIMIZERS["instance"]
    return {
        "variant": variant, "numpy_gemm_gflops": common.summarize(gemm), "runs": repeats,
        "rows": {label: {stage: common.summarize([rows[label][stage] for rows in repeats])
                         for stage in STAGES if stage in repeats[0][label]} for label in repeats[0]},
        # Paired within each repeat.
        "total_vs_instance": common.summarize([r[fused]["total_s"] / r[instance]["total_s"] for r in repeats]),
        "total_vs_timm": common.summarize([r[fused]["total_s"] / r["timm"]["total_s"] for r in repeats]),
        # Training speed, steady steps: timm's step time over keras_vit's (above 1: keras_vit trains faster).
        "speed_vs_timm": {label: common.summarize([r["timm"]["steady_s"] / r[label]["steady_s"] for r in repeats])
                          for label in (fused, instance)},
        "cpu_total_vs_instance": common.summarize([r[fused]["cpu_s"]["total_s"] / r[instance]["cpu_s"]["total_s"]
                                                   for r in repeats])}


def print_table(results):
    """Median seconds per stage over the repeats, then the paired ratios."""
    table = []
    for result in results:
        for label, row in result["rows"].items():
            table.append({"variant": result["variant"], "run": label,
                          **{stage[:-2]: f"{row[stage]['median']:.2f}" if stage in row else "" for stage in STAGES},
                          "GEMM GFLOP/s": f"{result['numpy_gemm_gflops']['median']:.0f}"})
    common.print_table(table, ["variant", "run", *(stage[:-2] for stage in STAGES), "GEMM GFLOP/s"])
    for result in results:
        print(f"{result['variant']}: first call (build to first step) {spread(result['total_vs_instance'])} x that "
              f"with a keras.optimizers.AdamW instance, {spread(result['total_vs_timm'])} x timm's; in CPU seconds "
              f"{spread(result['cpu_total_vs_instance'])} x the instance's; steady training speed "
              + ", ".join(f"{label} {spread(ratio)}" for label, ratio in result["speed_vs_timm"].items())
              + " x timm's")


def spread(summary):
    return f"{summary['median']:.2f} ({summary['min']:.2f}-{summary['max']:.2f})"


if __name__ == "__main__":
    app.run(main)
