"""The side-by-side suite: keras_vit against timm (and, on the CPU, ONNX Runtime and OpenVINO), in one run.

    python -m benchmarks.run --suite=cpu|gpu [--tiny] [--out=FILE.json]
        [--keras_vit_python=PATH] [--timm_python=PATH] [--rounds=N] [--seconds=S]

keras_vit and timm each run in a long-lived worker process (`benchmarks.worker`)
in an environment of its own with only what it needs, made on first use under
benchmarks/.envs/: keras_vit's core install, and timm from
`benchmarks/requirements-peers.txt`. The CPU suite adds the deployment peers, timm's
model exported to ONNX and run by ONNX Runtime and by OpenVINO (inference only,
each in a worker of its own in timm's environment), and keras_vit's SavedModel
served through TensorFlow's C API (`benchmarks.served_side`). For every configuration the
runner alternates the implementations round by round (A B A B ...), and every
round also times a matmul at a ViT shape in numpy, TensorFlow and PyTorch: the
fastest of the three is that round's matmul limit. Figures are medians over the
rounds with the min-max spread, so a noisy machine shows as noise.

keras_vit runs on the Keras backend that `KERAS_BACKEND` names: TensorFlow by
default, JAX where TensorFlow cannot be installed (the lent GPU machines: see
"GPU suite" in docs/performance.md); its matmul is then JAX's. On PyTorch
(`KERAS_BACKEND=torch`) the CPU suite is B/16 inference and S/16 training, keras_vit
eager against timm eager: the same framework underneath, so the ratio is Keras'
and keras_vit's own overhead.

FLOPs are analytic (`benchmarks.common.vit_forward_flops`): a forward pass is
2 x the multiply-adds of every matmul, a training step 3 x the forward.
Compile time and peak memory come from fresh processes (one per measurement):
the first call there includes tracing and XLA compilation.

Prints the tables and the targets of issues 18 and 44, and writes everything as JSON.
"""

import argparse
import concurrent.futures
import dataclasses
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks import common

ROOT = pathlib.Path(__file__).resolve().parent.parent
ENVS_DIR = ROOT / "benchmarks" / ".envs"  # gitignored
# The Keras backend of keras_vit's workers, which inherit the variable; JAX runs keras_vit where TensorFlow
# cannot be installed (BUILD.md), and in an environment of its own.
KERAS_BACKEND = os.environ.get("KERAS_BACKEND", "tensorflow")
_ON_JAX = KERAS_BACKEND == "jax"
_ON_TORCH = KERAS_BACKEND == "torch"
# The core install has no backend (setup.py): each environment brings its own.
# On TensorFlow the export extra too (no module Keras imports by itself): the served rows write an export.
_BACKEND_INSTALLS = {"tensorflow": [f"{ROOT}[tensorflow,export]"], "jax": [str(ROOT), "jax[cpu]==0.10.2"],
                     "torch": [str(ROOT), "torch==2.13.0"]}
INSTALLS = {"keras_vit": ["-e", *_BACKEND_INSTALLS.get(KERAS_BACKEND, [str(ROOT)])],
            "timm": ["-r", str(ROOT / "benchmarks" / "requirements-peers.txt")],
            "litert": ["-r", str(ROOT / "benchmarks" / "requirements-litert.txt")]}  # benchmarks.litert_converters
ENV_NAMES = {"keras_vit": "keras_vit" if KERAS_BACKEND == "tensorflow" else f"keras_vit_{KERAS_BACKEND}",
             "timm": "timm", "litert": "litert"}
# The environment each worker runs in: the deployment runtimes run timm's model exported to ONNX, beside timm.
ENVIRONMENT_OF = {"keras_vit": "keras_vit", "keras_vit_served": "keras_vit", "keras_vit_openvino": "keras_vit",
                  "keras_vit_onnxruntime": "keras_vit", "timm": "timm", "onnxruntime": "timm", "openvino": "timm"}
RUNTIMES = ("onnxruntime", "openvino")  # the deployment peers: inference only, compared with the faster of them
# The workers that time a matmul each round (the served worker runs an export only: its matmul is keras_vit's).
MATMUL_SIDES = ("keras_vit", "timm", *RUNTIMES)


@dataclasses.dataclass(frozen=True)
class Implementation:
    label: str
    impl: str  # a key of benchmarks.worker.SIDES
    compiled: bool  # keras_vit: XLA; timm: torch.compile
    scan_layers: bool = False  # keras_vit: ViT(scan_layers=True)
    tasks: tuple = ("inference", "training")

    def options(self):
        """What the worker's `prepare` gets beside the workload."""
        return {"compiled": self.compiled, **({"scan_layers": True} if self.scan_layers else {})}


@dataclasses.dataclass(frozen=True)
class Suite:
    threads: int
    image_size: int
    precision: str  # "float32" or "mixed_bfloat16"
    matmul_shape: tuple  # (m, k, n): the MLP of B/16 at the suite's batch
    inference: tuple  # (variant, batch) pairs
    training: tuple
    implementations: tuple
    memory_probe: tuple  # (variant, batch) of the fresh-process inference probe, or None
    compile_probes: tuple  # (variant, batch) pairs of the fresh-process training probes
    rounds: int
    seconds: float
    numpy_matmul: bool  # time numpy's BLAS too (CPU suites)
    num_layers: int = None  # overrides the variants' depth (--tiny)
    # Fresh-process probes run at once: 1 for figures (a probe must have the machine to itself); more
    # only where the figures mean nothing (--tiny, which checks the machinery).
    concurrent_probes: int = 1
    # Probe every implementation of a task, or (--tiny) one per worker kind, its first: a probe runs the same code
    # for every row of a side, only the options it passes on differ, and the warm workers run each of those.
    probe_every_row: bool = True

    @property
    def probe_workloads(self):
        """(task, (variant, batch)) of every fresh-process probe: the memory probe, then the compile probes."""
        return ([("inference", self.memory_probe)] if self.memory_probe else []) + [
            ("training", probe) for probe in self.compile_probes]

    def probed(self, task):
        """The implementations probed for `task`."""
        rows = [im for im in self.implementations if task in im.tasks]
        if self.probe_every_row:
            return rows
        first = {}
        for im in rows:
            first.setdefault(im.impl, im)
        return list(first.values())


_CPU_IMPLEMENTATIONS = (
    Implementation("keras_vit XLA", "keras_vit", True),
    Implementation("keras_vit XLA scan", "keras_vit", True, scan_layers=True),
    # The recipes' and Keras' default on a CPU (jit_compile="auto").
    Implementation("keras_vit graph", "keras_vit", False),
    # The SavedModel `python -m export` writes, run by TensorFlow's C API as TF Serving runs it.
    Implementation("keras_vit SavedModel", "keras_vit_served", False, tasks=("inference",)),
    # `python -m export --format=openvino`'s IR, run by OpenVINO as the OpenVINO row runs timm's ONNX.
    Implementation("keras_vit OpenVINO", "keras_vit_openvino", False, tasks=("inference",)),
    # `python -m export --format=onnx`'s file, run by ONNX Runtime as the ONNX Runtime row runs timm's.
    Implementation("keras_vit ONNX", "keras_vit_onnxruntime", False, tasks=("inference",)),
    Implementation("timm", "timm", False),
    # timm's model as a CPU deployment runs it: exported to ONNX, run by ONNX Runtime or OpenVINO.
    Implementation("ONNX Runtime", "onnxruntime", False, tasks=("inference",)),
    Implementation("OpenVINO", "openvino", False, tasks=("inference",)),
)

_RUNTIME_LABELS = {im.label for im in _CPU_IMPLEMENTATIONS if im.impl in RUNTIMES}

SUITES = {
    "cpu": Suite(
        threads=2, image_size=224, precision="float32", matmul_shape=(8 * 197, 768, 3072),
        inference=tuple((v, b) for v in ("Ti/16", "S/16", "B/16") for b in (1, 8)),
        training=(("Ti/16", 16), ("S/16", 16)), implementations=_CPU_IMPLEMENTATIONS,
        memory_probe=("B/16", 8), compile_probes=(("S/16", 16), ("B/16", 16)), rounds=3, seconds=1.5,
        numpy_matmul=True),
    "gpu": Suite(
        threads=os.cpu_count(), image_size=224, precision="mixed_bfloat16",
        matmul_shape=(256 * 197, 768, 3072),
        # A lent GPU is held briefly, start and compiles included (BUILD.md): the rows issue 18's
        # targets read (B/16 at batch 256) and batch 8 for latency, the default model against the peer. No
        # fresh-process probes: each warm process's first call holds the compile, and a process's peak RSS is
        # host memory, not the GPU's.
        inference=(("B/16", 8), ("B/16", 256)),
        training=(("B/16", 256),),
        implementations=(Implementation("keras_vit XLA", "keras_vit", True),
                         Implementation("timm compile", "timm", True)),
        memory_probe=None, compile_probes=(), rounds=3, seconds=1.5, numpy_matmul=False),
}


def shrink(suite):
    """The suite's settings on a seconds-long workload: a 1-layer Ti/16 at 32 px (tests/test_run.py).

    Fresh-process probes only for training, and of one implementation per worker kind: the memory probe is the
    same probe of another task, and each probe is a process that pays its framework's import (CI time).
    """
    return dataclasses.replace(
        suite, threads=min(suite.threads, 2), image_size=32, num_layers=1, matmul_shape=(64, 64, 64),
        inference=(("Ti/16", 1),), training=(("Ti/16", 2),), memory_probe=None,
        compile_probes=(("Ti/16", 2),) if suite.compile_probes else (), rounds=2, seconds=0.05, concurrent_probes=2,
        probe_every_row=False)


class WorkerProcess:
    """A `benchmarks.worker` process and its request/answer pipe."""

    def __init__(self, python, impl, threads):
        self.impl = impl
        # BLAS and OpenMP read their thread counts when loaded, hence the environment.
        threads_env = {name: str(threads) for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
        # On a GPU, TensorFlow and JAX would otherwise reserve most of its memory and starve the other worker.
        env = {**os.environ, **threads_env, "TF_CPP_MIN_LOG_LEVEL": "2", "TF_FORCE_GPU_ALLOW_GROWTH": "true",
               "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
        self.log = tempfile.TemporaryFile("w+")  # the frameworks' chatter, shown if the worker dies
        self.process = subprocess.Popen(
            [python, "-m", "benchmarks.worker", f"--impl={impl}", f"--threads={threads}"], cwd=ROOT, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True)

    def ask(self, op, **arguments):
        try:
            self.process.stdin.write(json.dumps({"op": op, **arguments}) + "\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()
        except BrokenPipeError:  # it had already exited
            line = ""
        if not line:
            self.log.seek(0)
            raise RuntimeError(f"the {self.impl} worker exited (code {self.process.wait()}) while asked {op} "
                               f"{arguments}; its last output:\n{self.log.read()[-3000:]}")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"the {self.impl} worker failed {op} {arguments}: {answer['error']}\n"
                               f"{answer['traceback']}")
        return answer

    def close(self):
        self.process.stdin.close()
        self.process.wait(timeout=120)
        self.log.close()


def environment_python(impl, requested, envs_dir):
    """Python of `impl`'s environment: `requested`, or one in `envs_dir`, made on first use.

    Each implementation is measured in an environment with only what it needs,
    as its users install it: keras_vit's core install (no training extras,
    whose scikit-learn and pandas Keras would import), and timm from
    requirements-peers.txt.
    """
    if requested:
        return requested
    folder = pathlib.Path(envs_dir) / ENV_NAMES[impl]
    stamp = folder / "installed.txt"  # what it was made from: a changed requirements file makes it again
    wanted = "\n".join([*INSTALLS[impl], *_requirement_lines(INSTALLS[impl])])
    if any(word.startswith(str(ROOT) + "[") for word in INSTALLS[impl]):  # the project's extras: setup.py's
        wanted += "\n" + (ROOT / "setup.py").read_text()
    if not (stamp.exists() and stamp.read_text() == wanted):
        print(f"making the {impl} environment {folder} (once): pip install {' '.join(INSTALLS[impl])}", flush=True)
        # Built under another name and renamed when whole, so a broken install never looks finished.
        staging = folder.with_name(folder.name + ".partial")
        subprocess.run([sys.executable, "-m", "venv", "--clear", staging], check=True)
        # --no-compile: torch's thousands of modules are byte-compiled when first imported, not all at install.
        install = [staging / "bin" / "python", "-m", "pip", "install", "-q", "--no-compile", *INSTALLS[impl]]
        if subprocess.run(install).returncode:
            raise SystemExit(f"could not install {impl} for the benchmark (pip install {' '.join(INSTALLS[impl])} "
                             f"needs PyPI). Make the environment yourself and pass --{impl}_python=PATH.")
        (staging / "installed.txt").write_text(wanted)
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(staging, folder)
    return str(folder / "bin" / "python")


def _requirement_lines(install):
    """The lines of the requirements files `install` names (`-r FILE`)."""
    files = [install[i + 1] for i, word in enumerate(install[:-1]) if word == "-r"]
    return [line for name in files for line in pathlib.Path(name).read_text().splitlines()]


def flops_per_call(task, variant, batch, suite):
    from keras_vit import decode_variant  # here, so that only asking for FLOPs loads TensorFlow

    config = decode_variant(variant)
    if suite.num_layers:
        config = config.replace(num_layers=suite.num_layers)
    forward = common.vit_forward_flops(suite.image_size, config.patch_size[0], config.hidden_size, config.mlp_dim,
                                       config.num_layers) * batch
    return forward * (3 if task == "training" else 1)


def matmul_limit_round(workers, shape, with_numpy, seconds):
    """GFLOP/s of one matmul in every library this round; the limit is the best."""
    m, k, n = shape
    calls = [(impl, worker, "matmul") for impl, worker in workers.items() if impl in MATMUL_SIDES]
    if with_numpy:  # in the keras_vit worker, so its BLAS threads are set like the others'
        calls.append(("numpy", workers["keras_vit"], "numpy_matmul"))
    return {library: 2.0 * m * k * n / worker.ask("time", name=name, seconds=seconds)["seconds_per_call"] / 1e9
            for library, worker, name in calls}


def measure(workers, suite, task, variant, batch, seconds):
    """Alternating rounds of every implementation on one configuration."""
    flops = flops_per_call(task, variant, batch, suite)
    implementations = [im for im in suite.implementations if task in im.tasks]
    first_call = {}
    for im in implementations:
        first_call[im.label] = workers[im.impl].ask(
            "prepare", name=im.label, task=task, variant=variant, batch=batch, image_size=suite.image_size,
            precision=suite.precision, num_layers=suite.num_layers, **im.options())["first_call_s"]
    rounds = []
    for _ in range(suite.rounds):
        limits = matmul_limit_round(workers, suite.matmul_shape, suite.numpy_matmul, min(seconds, 0.5))
        limit = max(limits.values())
        row = {"matmul_gflops": limits, "limit_gflops": limit, "images_per_s": {}, "fraction_of_limit": {}}
        for im in implementations:
            per_call = workers[im.impl].ask("time", name=im.label, seconds=seconds)["seconds_per_call"]
            row["images_per_s"][im.label] = batch / per_call
            row["fraction_of_limit"][im.label] = flops / per_call / 1e9 / limit
        rounds.append(row)
    for im in implementations:
        workers[im.impl].ask("release", name=im.label)
    return {"task": task, "variant": variant, "batch": batch, "image_size": suite.image_size,
            "gflop_per_call": flops / 1e9, "first_call_s_warm_process": first_call, "rounds": rounds,
            "summary": _summarize_rounds(rounds, implementations)}


def _compute_dtype(suite):
    return "bfloat16" if suite.precision == "mixed_bfloat16" else "float32"


def _summarize_rounds(rounds, implementations):
    peer = next(im.label for im in implementations if im.impl == "timm")
    runtimes = [im.label for im in implementations if im.impl in RUNTIMES]
    summary = {}
    for im in implementations:
        rates = [r["images_per_s"][im.label] for r in rounds]
        paired = list(zip(rates, rounds, strict=True))
        summary[im.label] = {
            "images_per_s": common.summarize(rates),
            "fraction_of_limit": common.summarize([r["fraction_of_limit"][im.label] for r in rounds]),
            # Paired within each round, so drift between rounds cancels.
            "vs_timm": common.summarize([rate / r["images_per_s"][peer] for rate, r in paired]),
        }
        if runtimes:  # against the faster deployment runtime of each round
            summary[im.label]["vs_runtime"] = common.summarize(
                [rate / max(r["images_per_s"][label] for label in runtimes) for rate, r in paired])
    return summary


def probe(python, impl, threads, **task):
    """First call and peak resident memory of one workload in a fresh process."""
    worker = WorkerProcess(python, impl, threads)
    try:
        worker.ask("versions")  # answered once the worker has imported its framework, which is not timed
        start = time.perf_counter()
        first = worker.ask("prepare", name="probe", **task)["first_call_s"]
        build_and_first = time.perf_counter() - start
        rss = worker.ask("peak_rss")["peak_rss_mb"]  # before timing more calls: the first call's peak
        steady = worker.ask("time", name="probe", seconds=0)["seconds_per_call"]
    finally:
        worker.close()
    # The first call also runs the workload once: what it costs beyond a steady call is tracing and compiling.
    return {"first_call_s": first, "steady_call_s": steady, "compile_s": first - steady,
            "build_and_first_call_s": build_and_first, "peak_rss_mb": rss}


def run_probes(suite, pythons):
    jobs = [(task, variant, batch, im) for task, (variant, batch) in suite.probe_workloads for im in suite.probed(task)]

    def measure(job):
        task, variant, batch, im = job
        return probe(pythons[ENVIRONMENT_OF[im.impl]], im.impl, suite.threads, task=task, variant=variant, batch=batch,
                     image_size=suite.image_size, precision=suite.precision, num_layers=suite.num_layers,
                     **im.options())

    results = []
    with concurrent.futures.ThreadPoolExecutor(suite.concurrent_probes) as pool:  # each probe is its own process
        for (task, variant, batch, im), measured in zip(jobs, pool.map(measure, jobs), strict=True):
            results.append({"task": task, "variant": variant, "batch": batch, "implementation": im.label,
                            **measured})
            print(f"probe {task} {variant} batch {batch} {im.label}: first call {measured['first_call_s']:.1f} s "
                  f"(steady {measured['steady_call_s']:.1f} s), peak RSS {measured['peak_rss_mb']:.0f} MB", flush=True)
    return results


def targets(results, probes, suite_name):
    """The targets of issues 18 and 44 for the suite, each with what was measured (None where not run)."""
    # What a user gets by default: XLA on JAX (no graph mode) and on GPUs; on a CPU the TF graph, which is what
    # training, `predict` (Keras' jit_compile="auto" is off there) and TF Serving run.
    default = "keras_vit graph" if suite_name == "cpu" and not _ON_JAX else "keras_vit XLA"

    def throughput(task, variant, batch, label="keras_vit XLA"):
        return next((r["summary"].get(label) for r in results
                     if (r["task"], r["variant"], r["batch"]) == (task, variant, batch)), None)

    checks = []

    def check(name, value, goal, at_least):
        met = None if value is None else (value >= goal if at_least else value <= goal)
        checks.append({"target": name, "measured": value, "goal": goal, "met": met})

    if suite_name == "gpu":  # issue 18's GPU rows
        for task, goal in (("training", 1500.0), ("inference", 5000.0)):
            t = throughput(task, "B/16", 256)
            check(f"B/16 {task} batch 256, images/s", t and t["images_per_s"]["median"], goal, True)
        return checks
    if suite_name != "cpu" or _ON_TORCH:  # issue 18's targets are TensorFlow's and JAX's
        return []
    for batch in (1, 8):
        t = throughput("inference", "B/16", batch, default)
        check(f"B/16 inference batch {batch}, {default}, x timm", t and t["vs_timm"]["median"], 1.0, True)
    b8 = throughput("inference", "B/16", 8, default)
    check(f"B/16 inference batch 8, {default}, fraction of matmul limit", b8 and b8["fraction_of_limit"]["median"],
          0.90, True)
    goal = 0.80 if _ON_JAX else 0.90
    for variant in ("Ti/16", "S/16"):
        t = throughput("training", variant, 16, default)
        check(f"{variant} training batch 16, {default}, x timm", t and t["vs_timm"]["median"], goal, True)
        if default != "keras_vit XLA":  # issue 18: a shorter first step at steady steps at most 3% slower
            xla = throughput("training", variant, 16)
            check(f"{variant} training batch 16, {default}, x keras_vit XLA", t and xla and
                  t["images_per_s"]["median"] / xla["images_per_s"]["median"], 0.97, True)
    for variant, limit in (("S/16", 10.0), ("B/16", 15.0)):
        first = next((p for p in probes if (p["task"], p["variant"], p["implementation"])
                      == ("training", variant, default)), None)
        check(f"{variant} first training step (build, trace, compile), {default}, s",
              first and first["build_and_first_call_s"], limit, False)
    if not _ON_JAX:  # issue 44: keras_vit as it is served against the deployment runtimes
        for variant in ("Ti/16", "B/16"):
            for batch in (1, 8):
                result = next((r for r in results if (r["task"], r["variant"], r["batch"]) == ("inference", variant,
                                                                                                  batch)), None)
                check(f"{variant} inference batch {batch}, {' or '.join(SERVED)}, x the faster runtime",
                      result and best_vs_runtime(result), 1.0, True)
        check(f"B/16 inference batch 8, peak memory, {' or '.join(SERVED)}, x the faster runtime",
              memory_vs_runtime(results, probes), 1.2, False)
    return checks


# keras_vit as a deployment runs it: in process under XLA, the SavedModel TF Serving loads, its OpenVINO IR or ONNX.
SERVED = ("keras_vit XLA", "keras_vit SavedModel", "keras_vit OpenVINO", "keras_vit ONNX")


def best_vs_runtime(result):
    """Median over the rounds of keras_vit's faster served form over the faster runtime, each of that round."""
    rounds = [r["images_per_s"] for r in result.get("rounds", ())]
    runtimes = [label for label in (rounds[0] if rounds else ()) if label in _RUNTIME_LABELS]
    if not runtimes:
        return None
    # A suite's JSON from before a served form existed lacks its row: the forms it measured.
    return statistics.median(max(r[label] for label in SERVED if label in r) / max(r[label] for label in runtimes)
                             for r in rounds)


def memory_vs_runtime(results, probes):
    """B/16 batch 8's peak memory: keras_vit's leaner served form over the faster runtime's (None if unprobed)."""
    result = next((r for r in results if (r["task"], r["variant"], r["batch"]) == ("inference", "B/16", 8)), None)
    rss = {p["implementation"]: p["peak_rss_mb"] for p in probes if (p["task"], p["variant"], p["batch"])
           == ("inference", "B/16", 8)}
    served = [label for label in SERVED if label in (result or {}).get("summary", {})]
    if not served or not all(label in rss for label in served):
        return None
    runtimes = [label for label in result["summary"] if label in _RUNTIME_LABELS and label in rss]
    if not runtimes:
        return None
    faster = max(runtimes, key=lambda label: result["summary"][label]["images_per_s"]["median"])
    return min(rss[label] for label in served) / rss[faster]


def print_tables(results, probes, checks):
    rows = []
    for r in results:
        for label, s in r["summary"].items():
            rate = s["images_per_s"]
            rows.append({"task": r["task"], "variant": r["variant"], "batch": r["batch"], "implementation": label,
                         "images/s median (min-max)": f"{rate['median']:.1f} ({rate['min']:.1f}-{rate['max']:.1f})",
                         "GFLOP/s": f"{rate['median'] * r['gflop_per_call'] / r['batch']:.0f}",
                         "of matmul limit": f"{s['fraction_of_limit']['median']:.0%}",
                         "x timm (min-max)": f"{s['vs_timm']['median']:.2f} ({s['vs_timm']['min']:.2f}-"
                                             f"{s['vs_timm']['max']:.2f})",
                         "x faster runtime": f"{s['vs_runtime']['median']:.2f}" if "vs_runtime" in s else "-",
                         "first call s": f"{r['first_call_s_warm_process'][label]:.1f}"})
    common.print_table(rows, list(rows[0]))
    if probes:
        print()
        common.print_table([{"probe (fresh process)": f"{p['task']} {p['variant']} batch {p['batch']}",
                             "implementation": p["implementation"], "first call s": f"{p['first_call_s']:.1f}",
                             "of which compile s": f"{p['compile_s']:.1f}", "peak RSS MB": f"{p['peak_rss_mb']:.0f}"}
                            for p in probes],
                           ["probe (fresh process)", "implementation", "first call s", "of which compile s",
                            "peak RSS MB"])
    if checks:
        print()
        common.print_table([{"target": c["target"], "goal": c["goal"],
                             "measured": "-" if c["measured"] is None else f"{c['measured']:.2f}",
                             "met": {True: "yes", False: "NO", None: "-"}[c["met"]]} for c in checks],
                           ["target", "goal", "measured", "met"])


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=sorted(SUITES), default="cpu")
    parser.add_argument("--out", help="JSON path (default benchmarks/results/suite_<suite>.json)")
    parser.add_argument("--keras_vit_python", help="python of an environment with keras_vit")
    parser.add_argument("--timm_python", help="python of an environment with timm and torch")
    parser.add_argument("--envs_dir", default=str(ENVS_DIR), help="where to make the environments")
    parser.add_argument("--tiny", action="store_true", help="the suite's settings on a seconds-long workload")
    parser.add_argument("--rounds", type=int, help="alternating rounds per configuration (suite default)")
    parser.add_argument("--seconds", type=float, help="seconds of calls per round and implementation")
    return parser.parse_args(argv)


def plan(args):
    """`(suite, out)`: the suite the flags ask for on this backend, and where its JSON goes."""
    suite = shrink(SUITES[args.suite]) if args.tiny else SUITES[args.suite]
    suite = dataclasses.replace(suite, rounds=args.rounds or suite.rounds, seconds=args.seconds or suite.seconds)
    if _ON_JAX:  # JAX has no graph mode: an uncompiled model would time Python's op-by-op dispatch
        suite = dataclasses.replace(suite, implementations=tuple(
            im for im in suite.implementations if im.compiled or im.impl != "keras_vit"))
    if _ON_TORCH:  # eager against eager (Keras' jit_compile on torch is torch.compile, timm's side has its own)
        if args.suite != "cpu":
            raise SystemExit(f"on KERAS_BACKEND=torch the benchmark runs the cpu suite; received --suite={args.suite}")
        suite = dataclasses.replace(
            suite, implementations=(Implementation("keras_vit eager", "keras_vit", False),
                                    Implementation("timm", "timm", False)),
            inference=suite.inference if args.tiny else (("B/16", 1), ("B/16", 8)),
            training=suite.training if args.tiny else (("S/16", 16),), memory_probe=None, compile_probes=())
    backend = "" if KERAS_BACKEND == "tensorflow" else f"_{KERAS_BACKEND}"
    name = f"suite_{args.suite}{backend}{'_tiny' * args.tiny}.json"
    return suite, pathlib.Path(args.out or ROOT / "benchmarks" / "results" / name)


def measure_all(workers, suite, gpu):
    """`(versions, results)`: every configuration of the suite, timed in the workers; `gpu`: the machine's."""
    versions = {impl: w.ask("versions")["versions"] for impl, w in workers.items()}
    blind = [impl for impl, found in versions.items() if gpu and found["device"] == "cpu"]
    if blind:  # it would time the CPU against the GPU, silently
        raise SystemExit(f"this machine has a GPU ({gpu}), but {' and '.join(blind)} sees none and would run on "
                         f"the CPU: {versions}")
    m, k, n = suite.matmul_shape
    for impl, worker in workers.items():
        if impl in MATMUL_SIDES:
            worker.ask("prepare", name="matmul", task="matmul", m=m, k=k, n=n, dtype=_compute_dtype(suite))
    if suite.numpy_matmul:
        workers["keras_vit"].ask("prepare", name="numpy_matmul", task="numpy_matmul", m=m, k=k, n=n)
    results = []
    for task, configs in (("inference", suite.inference), ("training", suite.training)):
        for variant, batch in configs:
            results.append(measure(workers, suite, task, variant, batch, suite.seconds))
            rates = ", ".join(f"{label} {s['images_per_s']['median']:.1f}"
                              for label, s in results[-1]["summary"].items())
            print(f"measured {task} {variant} batch {batch}: images/s {rates}", flush=True)
    return versions, results


def main(argv=None):
    args = parse_args(argv)
    # Named to the workers even when unset, so a backend in ~/.keras/keras.json cannot differ from this plan.
    os.environ["KERAS_BACKEND"] = KERAS_BACKEND
    suite, out = plan(args)
    pythons = {env: environment_python(env, getattr(args, f"{env}_python"), args.envs_dir)
               for env in dict.fromkeys(ENVIRONMENT_OF.values())}  # litert's is benchmarks.litert_converters' own
    machine = common.machine()
    started = time.perf_counter()
    workers = {impl: WorkerProcess(pythons[ENVIRONMENT_OF[impl]], impl, suite.threads)
               for impl in dict.fromkeys(im.impl for im in suite.implementations)}
    try:
        versions, results = measure_all(workers, suite, machine["gpu"])
    finally:
        for worker in workers.values():
            worker.close()
    probes = run_probes(suite, pythons)
    checks = targets(results, probes, args.suite)
    print_tables(results, probes, checks)
    limits = [r["limit_gflops"] for result in results for r in result["rounds"]]
    print(f"\nkeras_vit on Keras' {KERAS_BACKEND} backend; matmul limit {statistics.median(limits):.0f} GFLOP/s "
          f"({_compute_dtype(suite)}, {suite.threads} threads, shape {suite.matmul_shape}); "
          f"suite took {time.perf_counter() - started:.0f} s")
    common.write_json(out, {
        "suite": args.suite, "machine": machine, "versions": versions,
        "settings": {**dataclasses.asdict(suite), "flops": "forward = 2 x multiply-adds of every matmul; "
                                                             "training step = 3 x forward",
                     "xla_flags": os.environ.get("XLA_FLAGS", "")},  # the workers inherit them
        "matmul_limit_gflops": common.summarize(limits), "results": results, "probes": probes, "targets": checks,
        "wall_s": time.perf_counter() - started})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
