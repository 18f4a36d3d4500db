"""Every benchmark figure of README.md and docs/*.md, written from benchmarks/results/*.json.

    python -m benchmarks.figures            # rewrite the regions in place
    python -m benchmarks.figures --check    # exit 1 naming each region that is out of date

A region is the text between two marker lines in a Markdown file:

    <!-- figures:NAME -->
    ...generated, never edited by hand...
    <!-- /figures:NAME -->

NAME is a key of `REGIONS`; the same region may stand in several files. Each
region prints what one benchmark script measured, the way that script prints
it: `benchmarks.run` (images/s median (min-max), share of the matmul limit,
and the ratio to timm paired within each round), `benchmarks.export_latency`
(milliseconds, and the ratio of a runtime's median to Keras' median),
`benchmarks.serving_latency` (p50 and p99, and their ratio to Keras' export
paired within each round) and `benchmarks.main_job_seeds` (test top-1 per
seed, their mean and range). Nothing here measures or estimates: a figure that
is not in the JSON is not printed.

`--check` also refuses a benchmark-like figure (a ratio such as 1.25x, or a
number of ms, MB, GFLOP/s or images/s, or a percentage with decimals) written
in README.md or docs/*.md outside a region, so that no two places can disagree.
"""

import argparse
import json
import pathlib
import re
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = pathlib.Path("benchmarks") / "results"

# Every earlier CPU run of the suite, oldest first, kept to show the run-to-run drift and the machine's weight
# (the current run, suite_cpu.json, is in the question tables: each figure once).
DRIFT_RUNS = ("suite_cpu_earlier_run.json", "suite_cpu_with_graph_probes.json", "suite_cpu_previous_run.json",
              "suite_cpu_2026-11-22.json", "suite_cpu_2026-11-25_first.json", "suite_cpu_2026-11-25_second.json",
              "suite_cpu_2026-11-26.json", "suite_cpu_2026-11-27_first.json")
# The GPU suite on another kind of GPU than suite_gpu_jax.json's (the kind issue 18 names), before and after
# attention ran as cuDNN's fused kernel (docs/performance.md, "GPU suite"); each JSON names its machine.
GPU_MATMUL_ATTENTION = "suite_gpu_jax_matmul_attention.json"
GPU_H200 = "suite_gpu_jax_h200.json"
DRIFT_RUNS_JAX = ("suite_cpu_jax_2026-11-22.json", "suite_cpu_jax_2026-11-25.json", "suite_cpu_jax.json")

_REGION = re.compile(r"^<!-- (/?)figures:([A-Za-z0-9_-]+) -->[ \t]*$", re.MULTILINE)
_STRAY = re.compile(r"\b\d+\.\d+x\b|\b\d[\d,]*(?:\.\d+)? ?(?:ms|MB|GB|GFLOP/s|images/s|img/s)\b|\b\d+\.\d+%")
# docs/PRETRAINED.md is written by keras_vit.checkpoints.pretrained.markdown_table (tests/checkpoints/test_pretrained.py
# keeps it current).
_NOT_OURS = ("docs/PRETRAINED.md",)


# --- formatting, as the benchmark scripts print

def _spread(summary, fmt="{:.2f}"):
    """`median (min-max)` of a {"median", "min", "max"} summary."""
    return f"{fmt.format(summary['median'])} ({fmt.format(summary['min'])}-{fmt.format(summary['max'])})"


def _table(columns, rows):
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _machine(machine):
    gpu = f", {machine['gpu']}" if machine.get("gpu") else ""
    generation = ""
    if "cpu_family" in machine:  # the earliest runs did not record it
        isa = ", AVX-512" if machine["avx512"] else ""
        generation = f" (family {machine['cpu_family']} model {machine['cpu_model']}{isa})"
    settings = machine.get("isa_settings", {})  # runs before 2026-11-29 did not record them
    held = onednn = ""
    if "ONEDNN_MAX_CPU_ISA" in settings:
        held = f", held to {settings['ONEDNN_MAX_CPU_ISA']} (oneDNN, XLA, PyTorch)"
    if "TF_ENABLE_ONEDNN_OPTS" in settings:
        onednn = f", TF_ENABLE_ONEDNN_OPTS={settings['TF_ENABLE_ONEDNN_OPTS']}"
    return f"{machine['cpu']}{generation}{held}{onednn}, {machine['cores']} cores{gpu}"


def _load(results, name):
    return json.loads((results / name).read_text())


def _provenance(name, data):
    """"`benchmarks/results/NAME`: DATE, MACHINE", how every region names its source."""
    return f"`{RESULTS / name}`: {data['machine']['date']}, {_machine(data['machine'])}"


# --- benchmarks.run

def _short(label):
    """keras_vit's forms by their form alone ("XLA"), unless that is a peer's name ("keras_vit OpenVINO")."""
    short = label.replace("keras_vit ", "")
    return label if short in _PEER_LABELS else short


_PEER_LABELS = ("timm", "ONNX Runtime", "OpenVINO")


def _suite_line(suite, name):
    versions, settings = suite["versions"], suite["settings"]
    ours = versions["keras_vit"]
    backend = ours.get("backend", "tensorflow")
    backend_name = {"tensorflow": "TensorFlow", "jax": "JAX"}.get(backend, backend)
    limit = suite["matmul_limit_gflops"]
    return (f"{_provenance(name, suite)}; keras_vit on Keras "
            f"{ours['keras']} / {backend_name} {ours[backend]} against timm {versions['timm']['timm']} / torch "
            f"{versions['timm']['torch']}; {settings['image_size']} px, {settings['precision']}, "
            f"{settings['threads']} threads, "
            + (f"`XLA_FLAGS={settings['xla_flags']}`, " if settings.get("xla_flags") else "")
            + f"{settings['rounds']} rounds of {settings['seconds']:g} s per "
            f"implementation, {suite['wall_s']:.0f} s in all. Matmul limit (the fastest library at "
            f"{' x '.join(str(n) for n in settings['matmul_shape'])}, per round) "
            f"{_spread(limit, '{:.0f}')} GFLOP/s; each library's own, median (min-max) over every round: "
            + ", ".join(f"{_LIBRARIES.get(library, library).format(backend=backend_name)} {_spread(rates, '{:.0f}')}"
                        for library, rates in _matmul_rates(suite).items()) + ".")


# The matmul of each worker: keras_vit's is its Keras backend's.
_LIBRARIES = {"keras_vit": "{backend}", "timm": "PyTorch", "numpy": "numpy", "onnxruntime": "ONNX Runtime",
              "openvino": "OpenVINO"}


def _matmul_rates(suite):
    """{library: summary of its matmul GFLOP/s over every round of every configuration}."""
    values = {}
    for result in suite["results"]:
        for r in result["rounds"]:
            for library, rate in r["matmul_gflops"].items():
                values.setdefault(library, []).append(rate)
    return {library: {"median": statistics.median(v), "min": min(v), "max": max(v)} for library, v in values.items()}


def _throughput_table(suite, ratios=True):
    """Images/s and share of the matmul limit per implementation ("-" where it does not run the task), and with
    `ratios` each keras_vit row's ratio to timm."""
    labels = [im["label"] for im in suite["settings"]["implementations"]]
    ours = [im["label"] for im in suite["settings"]["implementations"] if im["impl"] == "keras_vit"] if ratios else []
    columns = (["task", "variant", "batch"] + [f"{_short(label)}: images/s, of limit" for label in labels]
               + [f"{_short(label)} / timm" for label in ours])
    rows = []
    for r in suite["results"]:
        s = r["summary"]
        rows.append([r["task"], r["variant"], r["batch"]]
                    + [f"{_spread(s[label]['images_per_s'], '{:.1f}')}, {s[label]['fraction_of_limit']['median']:.0%}"
                       if label in s else "-" for label in labels]
                    + [_spread(s[label]["vs_timm"]) if label in s else "-" for label in ours])
    return _table(columns, rows)


def _probe_table(suite):
    def seconds(p, key):  # + 0.0: a compile time that rounds to -0.0 prints as 0.0
        return f"{round(p[key], 1) + 0.0:.1f}" if key in p else "-"

    rows = [[f"{p['task']} {p['variant']} batch {p['batch']}", p["implementation"], seconds(p, "first_call_s"),
             seconds(p, "compile_s"), f"{p['peak_rss_mb']:,.0f}"] for p in suite["probes"]]
    return _table(["probe (fresh process)", "implementation", "first call s", "of which compile s", "peak RSS MB"],
                  rows)


def _first_call_table(suite):
    """Each configuration's first call in its worker, whose framework was already imported."""
    labels = [im["label"] for im in suite["settings"]["implementations"]]
    rows = [[r["task"], r["variant"], r["batch"]] + [f"{r['first_call_s_warm_process'][label]:.1f}"
                                                     if label in r["first_call_s_warm_process"] else "-"
                                                     for label in labels] for r in suite["results"]]
    return _table(["task", "variant", "batch"] + [f"{_short(label)}: first call s" for label in labels], rows)


def _targets_table(suite):
    met = {True: "yes", False: "NO", None: "-"}
    rows = [[c["target"], f"{c['goal']:g}", "-" if c["measured"] is None else f"{c['measured']:.2f}", met[c["met"]]]
            for c in suite["targets"]]
    return _table(["target (issue 18)", "goal", "measured", "met"], rows)


def suite_region(name, ratios=True):
    """One run of the suite, whole. Without `ratios` the rates alone: the ratios are in the question tables."""
    def region(results):
        suite = _load(results, name)
        return "\n\n".join([
            _suite_line(suite, name),
            "Throughput: images/s median (min-max) over the rounds and the median share of the matmul limit"
            + ("; the ratio to timm is taken within each round, median (min-max)." if ratios else
               " (the ratios are in the tables above)."),
            _throughput_table(suite, ratios),
            *(["First call and peak memory, each in a fresh process (compile = first call - a steady call):",
               _probe_table(suite)] if suite["probes"] else
              ["First call of each configuration (build excluded: tracing, compiling and one call), in its "
               "worker, framework already imported:", _first_call_table(suite)]),
            *([_targets_table(suite)] if ratios else [])])
    return region


def gpu_region(results):
    """Who is faster on a GPU: keras_vit under XLA against timm under `torch.compile`, on each GPU lent."""
    runs = (("suite_gpu_jax.json", "cuDNN attention"), (GPU_H200, "cuDNN attention"),
            (GPU_MATMUL_ATTENTION, "attention by matmuls"))
    suites = [(name, _load(results, name), how) for name, how in runs]
    rows = [[r["task"], r["variant"], r["batch"]] + [_vs_timm(suite, r["task"], r["variant"], r["batch"])
                                                     for _, suite, _ in suites] for r in suites[0][1]["results"]]
    columns = [f"{suite['machine']['gpu'].replace('NVIDIA ', '')}, {how}" for _, suite, how in suites]
    return ("keras_vit XLA (Keras' JAX backend, `mixed_bfloat16`) over timm under `torch.compile` (bf16 autocast), "
            "images/s ratio taken within each round, median (min-max). Each column is one run on a lent machine: "
            + "; ".join(_provenance(name, suite) for name, suite, _ in suites) + ".\n\n"
            + _table(["task", "variant", "batch"] + columns, rows))


def _vs_timm(suite, task, variant, batch, label="keras_vit XLA"):
    row = next((r for r in suite["results"] if (r["task"], r["variant"], r["batch"]) == (task, variant, batch)),
               None)
    if row is None or label not in row["summary"]:
        return "-"
    return _spread(row["summary"][label]["vs_timm"])


_HEADLINE = (("inference", "B/16", 1), ("inference", "B/16", 8), ("training", "Ti/16", 16), ("training", "S/16", 16))


def drift_region(runs, backend):
    def region(results):
        columns = (["run", "date, machine", "matmul limit GFLOP/s", "s per timing", "wall s"]
                   + [f"{v} {t} batch {b}" for t, v, b in _HEADLINE])
        rows = []
        for name in runs:
            suite = _load(results, name)
            rows.append([f"`{name}`", f"{suite['machine']['date']}, {_machine(suite['machine'])}",
                         f"{suite['matmul_limit_gflops']['median']:.0f}", f"{suite['settings']['seconds']:g}",
                         f"{suite['wall_s']:.0f}"] + [_vs_timm(suite, *config) for config in _HEADLINE])
        return (f"keras_vit XLA / timm, median (min-max) of the per-round ratios, in CPU runs of the suite on "
                f"{backend} (same versions, oldest first). Runs before 2026-11-25 did not record the CPU's family; "
                "their matmul limit tells their machine apart:\n\n" + _table(columns, rows))
    return region


def cpu_inference_region(results):
    """Who serves a ViT fastest on a CPU: every implementation against the faster deployment runtime."""
    suite = _load(results, "suite_cpu.json")
    labels = [im["label"] for im in suite["settings"]["implementations"] if "inference" in im.get("tasks", ())]
    rows = [[r["variant"], r["batch"]] + [_spread(r["summary"][label]["vs_runtime"]) for label in labels]
            for r in suite["results"] if r["task"] == "inference"]
    return (f"Inference, images/s over the faster of ONNX Runtime and OpenVINO in the same round (both run timm's "
            f"model exported to ONNX), median (min-max) over the rounds; above 1 is faster than both. "
            f"{_provenance('suite_cpu.json', suite)}, float32, 224 px, 2 threads each.\n\n"
            + _table(["variant", "batch"] + [f"{_short(label)} / faster runtime" for label in labels], rows))


def cpu_training_region(results):
    """Who trains a ViT fastest on a CPU: keras_vit's forms against timm (the runtimes do not train)."""
    suite = _load(results, "suite_cpu.json")
    labels = [im["label"] for im in suite["settings"]["implementations"]
              if im["impl"] == "keras_vit" and "training" in im.get("tasks", ("training",))]
    rows = [[r["variant"], r["batch"]] + [_spread(r["summary"][label]["vs_timm"]) for label in labels]
            for r in suite["results"] if r["task"] == "training"]
    return (f"Training steps (AdamW), images/s over timm's (eager, the CPU's way) in the same round, median (min-max) "
            f"over the rounds. {_provenance('suite_cpu.json', suite)}, float32, 224 px, 2 threads each.\n\n"
            + _table(["variant", "batch"] + [f"{_short(label)} / timm" for label in labels], rows))


# --- benchmarks.first_call

FIRST_CALL_RUNS = ("first_call_cpu.json", "first_call_cpu_avx2.json", "first_call_cpu_avx2_onednn_off.json")


def first_call_region(results):
    """The first training call on Keras' own path by stage, beside a Keras AdamW instance and timm: one table per
    run (this CPU; held to AVX2; held to AVX2 with TensorFlow's oneDNN off, its own default there)."""
    return "\n\n".join(_first_call_run(results, name) for name in FIRST_CALL_RUNS)


def _first_call_run(results, name):
    data = _load(results, name)
    stages = ("build_s", "trace_s", "first_run_s", "total_s", "steady_s")
    rows = []
    for result in data["results"]:
        for label, row in result["rows"].items():
            ratios = [run[label]["total_s"] / run["timm"]["total_s"] for run in result["runs"]]
            speed = [run["timm"]["steady_s"] / run[label]["steady_s"] for run in result["runs"]]
            rows.append([result["variant"], label.replace("compile", "`compile") + "`" if label != "timm" else label]
                        + [_spread(row[stage], "{:.1f}") if stage in row else "-" for stage in stages]
                        + [_spread({"median": statistics.median(r), "min": min(r), "max": max(r)})
                           for r in (ratios, speed)])
    gemm = ", ".join(f"{r['variant']} {_spread(r['numpy_gemm_gflops'], '{:.0f}')}" for r in data["results"])
    settings = data["settings"]
    return (f"{_provenance(name, data)}; batch {settings['batch']}, {settings['image_size']} px, "
            f"{settings['threads']} threads, each row a fresh process, {settings['repeats']} of each, alternating; "
            f"seconds, median (min-max). numpy's GEMM in the same runs, GFLOP/s: {gemm}.\n\n"
            + _table(["variant", "run", "build", "trace", "first run", "build to first step", "steady step",
                      "build to first step / timm's", "training speed / timm's"], rows))


# --- benchmarks.export_latency

def export_latency_region(results):
    data = _load(results, "export_latency_cpu.json")
    rows = [[r["variant"], r["runtime"], _spread(r["latency_ms"], "{:.1f}"), _spread(r["vs_keras"], "{:.2f}"),
             _spread(r["speed_up_over_saved_model"], "{:.2f}")] for r in data["results"]]
    gemm = data["results"][0]["gemm_gflops"]
    return (f"{_provenance('export_latency_cpu.json', data)}, "
            f"TensorFlow {data['tensorflow']}, every runtime on {data['threads']} threads; batch-1 latency, median "
            f"(min-max) over the rounds; the "
            f"ratio to Keras' (XLA) and the SavedModel's latency over this one (the speed-up issue 18 asks of "
            f"LiteRT: >= 2.5x fp32, >= 4x int8), each taken within a round, median (min-max). numpy's GEMM in the "
            f"same rounds: "
            f"{_spread(gemm, '{:.0f}')} GFLOP/s.\n\n"
            + _table(["variant", "runtime", "ms", "vs keras", "speed-up over SavedModel"], rows))


# --- benchmarks.int8_agreement

def int8_agreement_region(results):
    data = _load(results, "int8_agreement_cpu.json")
    rows = [[r["model"], r["lever"], r["calibration_images"], f"{r['top1_agreement']:.2%}", r["flips"],
             "yes" if r["passes"] else "no", f"{r['relative_logit_error']:.4f}", sum(r["float_ops"].values()),
             f"{r['latency_vs_default']:.2f}x"] for r in data["results"]]
    float_top1 = {r["model"]: r["float_top1"] for r in data["results"]}
    return (f"{_provenance('int8_agreement_cpu.json', data)}, TensorFlow {data['tensorflow']}; full int8 "
            f"against the float model on the 360 test digits (float test top-1: "
            f"{', '.join(f'{model} {top1:.1%}' for model, top1 in float_top1.items())}), calibrated on the "
            f"training digits; logit error: "
            f"mean |difference| over mean |logit|; latency: batch-1 invoke, one thread, median ratio to the "
            f"default within alternating rounds.\n\n"
            + _table(["model", "lever", "calibration images", "top-1 agreement", "flips", ">= 99%",
                      "logit error", "float ops", "latency vs default"], rows))


# --- benchmarks.tflite_int8_ops

def tflite_int8_ops_region(results):
    data = _load(results, "tflite_int8_ops_cpu.json")
    rows = [[r["op"], r["calls_per_model"], f"{r['float32_ms']['median']:.3f}", f"{r['int8_ms']['median']:.3f}",
             f"{r['int8_ms']['median'] / r['float32_ms']['median']:.1f}x", "yes" if r["int8_delegated"] else "no",
             "not exported" if r["int8_share_of_model"] is None else f"{r['int8_share_of_model']:.0%}"]
            for r in data["results"]]
    return (f"{_provenance('tflite_int8_ops_cpu.json', data)}, "
            f"TensorFlow {data['tensorflow']}; each op alone at Ti/16's shapes, batch 1, one thread, median ms "
            f"over the rounds; its calls in the exported Ti/16 int8 model times its int8 time, as a share of "
            f"that model timed in the same rounds ({_spread(data['model_int8_ms'], '{:.1f}')} ms); Keras' own "
            f"forms of two ops, which the int8 export replaces, are not in it. numpy's GEMM "
            f"in the same rounds: {_spread(data['gemm_gflops'], '{:.0f}')} GFLOP/s.\n\n"
            + _table(["op", "calls", "float32 ms", "int8 ms", "int8 / float32", "XNNPACK takes some of int8",
                      "share of the int8 model"], rows))


# --- benchmarks.litert_converters

_LITERT_PATHS = {"a": "tf.lite (TF 2.20)", "b": "litert-converter (JAX backend) + ai-edge-quantizer",
                 "c": "litert-torch (PyTorch backend) + ai-edge-quantizer",
                 "d": "ai-edge-quantizer on tf.lite's float file"}


def litert_converters_region(results):
    data = _load(results, "litert_converters_cpu.json")
    found = {(r["path"], r["model"], r["quantize"]): r for r in data["results"]}
    rows = []
    for (path, model, quantize), ti in found.items():
        if model != "ti16":
            continue
        digits = found.get((path, "digits", quantize), {})
        speed = ti.get("latency_vs_a")
        builtin = "no" if ti.get("non_builtin_ops") else "yes"
        rows.append([_LITERT_PATHS.get(path, data["paths"][path]), quantize, builtin, ti["io"],
                     f"{ti['max_abs_diff_probabilities']:.1e}",
                     f"{digits['top1_agreement']:.2%}" if "top1_agreement" in digits else "not run",
                     _spread(speed) + "x" if speed else "not timed"])
    versions = data["versions"]["torch"]
    return (f"{_provenance('litert_converters_cpu.json', data)}, TensorFlow {data['versions']['main']['tensorflow']}, "
            f"litert-converter {versions['litert-converter']}, litert-torch {versions['litert-torch']}, "
            f"ai-edge-quantizer {versions['ai-edge-quantizer']}; Ti/16 at 224 px (random weights): max |difference| of "
            f"probabilities against Keras, and batch-1 invoke time on one thread over that of tf.lite's file of the "
            f"same quantization (above 1: slower), median (range) over {data['rounds']} alternating rounds; the main "
            f"job's digits model: top-1 agreement with Keras on the 360 test digits.\n\n"
            + _table(["converter", "quantization", "builtin ops only", "input -> output", "Ti/16 max difference",
                      "digits top-1 agreement", "time vs tf.lite"], rows))


# --- benchmarks.serving_latency

def serving_latency_region(results):
    data = _load(results, "serving_latency_cpu.json")
    rows = [[r["variant"], r["runtime"], _spread(r["p50_ms"], "{:.1f}"), _spread(r["p50_vs_keras"]),
             _spread(r["p99_ms"], "{:.1f}"), _spread(r["p99_vs_keras"])] for r in data["results"]]
    gemm = data["results"][0]["gemm_gflops"]
    return (f"{_provenance('serving_latency_cpu.json', data)}, "
            f"TensorFlow {data['tensorflow']}; {data['requests_per_round']} batch-1 requests per runtime in each "
            f"round. p50 and p99 are medians (min-max) over the rounds; the ratio to Keras' export is taken "
            f"within each round. numpy's GEMM in the same rounds: {_spread(gemm, '{:.0f}')} GFLOP/s.\n\n"
            + _table(["variant", "runtime", "p50 ms", "p50 / Keras export", "p99 ms", "p99 / Keras export"], rows))


# --- benchmarks.serving_load

def serving_load_region(results):
    data = _load(results, "serving_load_cpu.json")
    rows = [[kind, "good" if k["good"] else "bad (InvalidArgument)", k["count"], k["mismatches"],
             f"{k['p50_ms']:.0f}", f"{k['p99_ms']:.0f}"] for kind, k in sorted(data["kinds"].items())]
    return (f"{_provenance('serving_load_cpu.json', data)}, TensorFlow {data['tensorflow']}: ViT-{data['variant']}, "
            f"{data['threads']} client threads for {data['seconds']:.0f} s: {data['requests']:,} requests "
            f"({data['requests_per_s']:.0f} a second), {data['mismatches']} answers differing from the request's "
            f"answer alone, {data['hung_clients']} clients left hanging; resident memory "
            f"{data['resident_mib_after_warmup']:,.0f} MiB after warm-up and {data['resident_mib_after_run']:,.0f} MiB "
            f"after the run (bound: {data['memory_bound_mib']} MiB of growth).\n\n"
            + _table(["request", "kind", "sent", "mismatches", "p50 ms", "p99 ms"], rows))


# --- benchmarks.main_job_seeds

def _seeds(data):
    summary, runs = data["summary"], data["runs"]
    first = runs[0]
    repeat = {True: ", and gave it again in a second process",
              False: f"; a second process of seed {first['seed']} gave {runs[-1]['test_top1']:.2%}",
              None: ""}[data.get("first_seed_repeats")]
    seeds = sorted({r["seed"] for r in runs})
    listed = f"{seeds[0]}-{seeds[-1]}" if seeds == list(range(seeds[0], seeds[-1] + 1)) else ", ".join(map(str, seeds))
    return (f"test top-1 over seeds {listed}: mean {summary['mean']:.2%}, range "
            f"{summary['min']:.2%}-{summary['max']:.2%}; seed {first['seed']} gives {first['test_top1']:.2%}{repeat}")


def main_job_region(results):
    data = _load(results, "main_job_seeds.json")
    seconds = [r["seconds"] for r in data["runs"]]
    return (f"Its {_seeds(data)} (`python -m benchmarks.main_job_seeds`, {data['machine']['date']}, "
            f"{_machine(data['machine'])}: each run {min(seconds):.0f}-{max(seconds):.0f} s; "
            f"`{RESULTS / 'main_job_seeds.json'}`).")


def main_job_seeds_region(results):
    data = _load(results, "main_job_seeds.json")
    rows = [[r["seed"], f"{r['test_top1']:.2%}", f"{r['test_top5']:.2%}", r["step"], f"{r['seconds']:.0f}"]
            for r in data["runs"]]
    return (f"{_provenance('main_job_seeds.json', data)}; "
            f"{_seeds(data)}.\n\n" + _table(["seed", "test top-1", "test top-5", "steps", "s"], rows))


def fewshot_region(results):
    """The few-shot table of the trained digits model beside the same architecture untrained."""
    runs = [(label, _load(results, name)) for label, name in (
        ("trained (the main job)", "fewshot_digits.json"), ("untrained (seed 0)", "fewshot_digits_untrained.json"))]
    first = runs[0][1]
    shots = sorted(first["results"], key=int)
    rows = [[label] + [f"{data['results'][n]['mean']:.1%} ({data['results'][n]['min']:.1%}-"
                       f"{data['results'][n]['max']:.1%})" for n in shots] for label, data in runs]
    return (f"`{RESULTS / 'fewshot_digits.json'}`, `{RESULTS / 'fewshot_digits_untrained.json'}`: "
            f"{first['dataset']} {first['train_split']} -> {first['eval_split']} ({first['eval_examples']} "
            f"images, {first['num_classes']} classes), `{first['feature_layer']}` features of width "
            f"{first['feature_width']}, mean (min-max) over {first['draws']} draws, seed {first['seed']}, "
            f"l2_reg {first['l2_reg']:g}.\n\n" + _table(["features", *[f"{n}-shot" for n in shots]], rows))


# --- benchmarks.remat_memory

def remat_memory_region(results):
    data = _load(results, "remat_memory_cpu.json")
    rows = [[i, f"{r['gemm_gflops']:.0f}", f"{r['plain']['peak_rss_mb']:.0f}", f"{r['remat']['peak_rss_mb']:.0f}",
             f"{r['memory_ratio']:.2f}x", f"{r['plain']['step_s']:.1f}", f"{r['remat']['step_s']:.1f}",
             f"{r['step_ratio']:.2f}x"] for i, r in enumerate(data["rounds"])]
    summary = data["summary"]
    verdict = "met" if summary["met"] else "not met"
    return (f"{_provenance('remat_memory_cpu.json', data)}; "
            f"{data['variant']} training, batch {data['batch']}, AdamW, XLA {'on' if data['jit_compile'] else 'off'}, "
            f"{data['steps']} timed steps per process after the compiling one. remat / plain: peak memory "
            f"{_spread(summary['memory_ratio'])}x, step time {_spread(summary['step_ratio'])}x (median, min-max over "
            f"rounds); the target ({data['target']}) is {verdict}.\n\n"
            + _table(["round", "GEMM GFLOP/s", "peak MB plain", "peak MB remat", "memory", "step s plain",
                      "step s remat", "step time"], rows))


# --- benchmarks.patch_dropout

def patch_dropout_region(results):
    data = _load(results, "patch_dropout_cpu.json")
    rows = [[f"{r['patch_dropout']:g}", r["tokens"], _spread(r["step_cpu_s"]), f"{_spread(r['cpu_ratio'])}x",
             _spread(r["step_s"]), f"{_spread(r['step_ratio'])}x", _spread(r["cores_busy"], "{:.1f}"),
             _spread(r["peak_rss_mb"], "{:.0f}"), f"{_spread(r['memory_ratio'])}x",
             f"{_spread(r['step_memory_ratio'])}x"] for r in data["results"]]
    gemms = [r["gemm_gflops"] for r in data["rounds"]]
    fit = data["memory_fit"]
    return (f"{_provenance('patch_dropout_cpu.json', data)}; {data['variant']} training at {data['image_size']} px, "
            f"batch {data['batch']}, AdamW, XLA {'on' if data['jit_compile'] else 'off'}, {data['steps']} timed steps "
            f"per process after the compiling one, a fresh process per rate in each of {len(data['rounds'])} rounds, "
            f"each round starting with numpy's GEMM ({min(gemms):.0f}-{max(gemms):.0f} GFLOP/s). Tokens: those the "
            "blocks see in training (class token and kept patches). Each rate's ratios are to rate 0 in the same "
            "round: the step's CPU time and wall time (cores busy: CPU over wall time; the machine's other "
            "processes take cores, which CPU time does not count), peak memory (`ru_maxrss`) and the step's own "
            "memory (peak minus the memory before the first step); median "
            f"(min-max) over the rounds. A least-squares line through the median peaks gives {fit['fixed_mb']:.0f} "
            f"MB that do not scale with the tokens (runtime, weights, gradients, AdamW's state) and "
            f"{fit['per_token_mb']:.1f} MB per token.\n\n"
            + _table(["patch_dropout", "tokens", "CPU s", "CPU time", "wall s", "wall time", "cores busy", "peak MB",
                      "peak memory", "step memory"], rows))


# --- benchmarks.rope_inference

def rope_inference_region(results):
    data = _load(results, "rope_inference_cpu.json")
    baseline = data["results"][0]["model"]
    rows = [[r["model"], r["position_embedding"], r["rotary_embedding"] or "-", _MET[r["dynamic_image_size"]],
             _spread(r["ms"], "{:.0f}"), f"{_spread(r['ratio'])}x", f"{_spread(r['cpu_ratio'])}x"]
            + (["-", "-", "-"] if r.get("diagnosis") else
               [_spread(r["first_call_s"], "{:.1f}"), f"{_spread(r['first_call_ratio'])}x",
                "-" if r["model"] == baseline else _MET[r["met"]]])
            for r in data["results"]]
    diagnosis = ("; a row ending in \"no rotation\" is a diagnosis, that model traced with each block's rotation "
                 "skipped (`--without_rotation`)" if any(r.get("diagnosis") for r in data["results"]) else "")
    gemms = [r["gemm_gflops"] for r in data["steady_rounds"]]
    verdict = "met" if data["summary"]["met"] else "not met"
    return (f"{_provenance('rope_inference_cpu.json', data)}; {data['variant']} inference at {data['image_size']} "
            f"px, batch {data['batch']}, float32, `{data['form']}` (`benchmarks.run`'s "
            f"\"keras_vit {'XLA' if data['jit_compile'] else 'graph'}\" form), {data['threads']} threads; "
            f"{len(data['steady_rounds'])} rounds, each starting with numpy's GEMM ({min(gemms):.0f}-{max(gemms):.0f} "
            f"GFLOP/s), the models taking turns call by call, {data['calls']} timed calls each per round (their "
            f"median). Steady: milliseconds per batch, and the ratio to the learned_1d model within each round, of "
            f"wall time and of the process's CPU time (less disturbed by others' load); first call: build, trace and "
            f"first answer in a fresh process per model ({data['rounds']} each), and its ratio to the learned_1d "
            f"model's in the same turn; median (min-max){diagnosis}. The target ({data['target']}) is {verdict}.\n\n"
            + _table(["model", "position_embedding", "rotary_embedding", "dynamic", "ms", "x learned_1d",
                      "CPU time x", "first call s", "first call x", "met"], rows))


# --- benchmarks.input_pipeline

# The host cores a TPU v4-8 needs, from what we measured per core and what the chips would consume. No
# DeiT-B/16 throughput on v4 is published; we scale big_vision's ViT-S/16 ImageNet run ("6-7h" for 90
# epochs of 1,281,167 images on a TPU-v3-8, big_vision/configs/vit_s16_i1k.py) by B/16's FLOPs over
# S/16's and by v4's bf16 peak over v3's (275 / 123 TFLOP/s, cloud.google.com/tpu/docs/v4 and /v3),
# assuming the same utilisation.
S16_V3_8_IMAGES_PER_S = (90 * 1_281_167 / (7 * 3600), 90 * 1_281_167 / (6 * 3600))
V4_OVER_V3 = 275 / 123


def input_pipeline_region(results):
    from benchmarks import common

    data = _load(results, "input_pipeline_cpu.json")
    summary = data["summary"]
    rows = [[side, _spread(summary[side]["images_per_s"], "{:.0f}"),
             _spread(summary[side]["images_per_cpu_s"], "{:.0f}"),
             "-" if side == "keras_vit" else f"{_spread(summary['cpu_ratio_' + side])}x"]
            for side in ("keras_vit", "timm", "timm_plain")]
    b16, s16 = (common.vit_forward_flops(224, 16, width, 4 * width, 12) for width in (768, 384))
    consumed = [rate * V4_OVER_V3 * s16 / b16 for rate in S16_V3_8_IMAGES_PER_S]
    per_core = summary["keras_vit"]["images_per_cpu_s"]["median"]
    cores = [rate / per_core for rate in consumed]
    verdict = "met" if summary["met"] else "not met"
    rounds = data["rounds"] if isinstance(data["rounds"], int) else len(data["rounds"])
    return (f"{_provenance('input_pipeline_cpu.json', data)}; "
            f"{data['dataset']['images']} JPEGs of {data['dataset']['size']}, batch {data['batch']}, "
            f"{data['timed_images']} timed images per side and round, {rounds} "
            f"rounds, median (min-max). Images per CPU-second counts every process of a side (timm's "
            f"workers included); the ratio is keras_vit's over the side's, within each round. The target "
            f"({data['target']}) is {verdict}.\n\n"
            + _table(["side", "images/s (wall)", "images per CPU-second", "keras_vit / side"], rows)
            + f"\n\nA TPU v4-8 training DeiT-B/16 would consume about {consumed[0]:,.0f}-{consumed[1]:,.0f} "
            f"images/s (our estimate, explained in `benchmarks/figures.py`), so at {per_core:.0f} images per "
            f"CPU-second it needs about {cores[0]:.0f}-{cores[1]:.0f} host cores for this pipeline; the batch "
            f"size does not change the per-image cost.")


# --- benchmarks.digits_pretraining

def digits_pretraining_region(results):
    """Each arm's test top-1 over seeds, the from-scratch rows first."""
    data = _load(results, "digits_pretraining.json")
    rows = [[name, f"{arm['mean']:.2%}", f"{arm['min']:.2%}-{arm['max']:.2%}",
             ", ".join(f"{r['test_top1']:.2%}" for r in arm["runs"])] for name, arm in data["results"].items()]
    seconds = [r["seconds"] for arm in data["results"].values() for r in arm["runs"]]
    return (f"{_provenance('digits_pretraining.json', data)}; "
            f"{data['steps']} steps per arm (MPP: half pre-training, half fine-tuning), seeds "
            f"{', '.join(map(str, data['seeds']))}, each run {min(seconds):.0f}-{max(seconds):.0f} s. The "
            f"teacher CNN's test top-1: {data['teacher_top1']:.2%}. Test top-1 on the 360 test digits:\n\n"
            + _table(["arm", "mean", "range", "per seed"], rows))


# --- benchmarks.fine_tuning_digits

def fine_tuning_digits_region(results):
    """Each fine-tuning arm's test top-1 and best validation top-1 over seeds, from the same MPP models."""
    data = _load(results, "fine_tuning_digits.json")
    rows = [[name, f"{arm['mean']:.2%}", f"{arm['min']:.2%}-{arm['max']:.2%}",
             ", ".join(f"{r['test_top1']:.2%}" for r in arm["runs"]),
             f"{arm['best_validation']['mean']:.2%}",
             f"{arm['best_validation']['min']:.2%}-{arm['best_validation']['max']:.2%}"]
            for name, arm in data["results"].items()]
    seconds = [r["seconds"] for arm in data["results"].values() for r in arm["runs"]]
    steps, examples = data["steps"], data["examples"]
    return (f"{_provenance('fine_tuning_digits.json', data)}; per seed ({', '.join(map(str, data['seeds']))}) one "
            f"MPP pre-training of {steps['pretraining']} steps, then four fine-tunes of its `model.npz` for "
            f"{steps['fine_tuning']} steps each, holding out {data['validation_fraction']:.0%} of the training "
            f"images ({examples['validation']}) and evaluating them every {data['eval_every']} steps; each "
            f"fine-tune {min(seconds):.0f}-{max(seconds):.0f} s, {data['wall_s'] / 60:.0f} minutes in all. Test "
            f"top-1 of the final model (with the EMA, the average) on the {examples['test']} test digits, and the "
            "best validation top-1:\n\n"
            + _table(["arm", "test mean", "test range", "test per seed", "best validation mean",
                      "best validation range"], rows))


# --- issue 18's targets, one row each (the README's performance table)

_PERFORMANCE = "docs/performance.md"
_MET = {True: "yes", False: "no"}
# The sections of docs/performance.md the rows link to, by anchor, with the link's text.
_SECTIONS = {"cpu-suite-tensorflow-backend": "TF", "cpu-suite-keras-jax-backend": "JAX",
             "training-input-pipeline": "input pipeline", "training-memory-remat": "remat",
             "serving-latency": "serving latency", "export-latency": "export latency", "gpu-suite": "GPU suite",
             "serving-on-a-cpu-keras_vit-timm-onnx-runtime-openvino": "runtimes"}


def _suite_targets(results, name, pattern):
    """[(measured, met)] of `name`'s suite targets whose name matches `pattern`, in the suite's order."""
    found = [(c["measured"], c["met"]) for c in _load(results, name)["targets"] if re.fullmatch(pattern, c["target"])]
    if not found:
        raise FiguresError(f"{RESULTS / name} has no target matching {pattern!r}")
    return found


def _suite_row(name, pattern, fmt="{:.2f}"):
    def row(results):
        found = _suite_targets(results, name, pattern)
        return ", ".join(fmt.format(value) for value, _ in found), _MET[all(met for _, met in found)]
    return row


def _spread_row(summary, goal, at_least=True):
    """A median (min-max) against a goal: met at the median only when some rounds miss it."""
    def meets(value):
        return value >= goal if at_least else value <= goal
    met = _MET[meets(summary["median"])]
    if meets(summary["median"]) and not (meets(summary["min"]) and meets(summary["max"])):
        met = "median only"
    return _spread(summary), met


def _input_pipeline_row(results):
    data = _load(results, "input_pipeline_cpu.json")
    return f"{_spread(data['summary']['cpu_ratio_timm'])}", _MET[data["summary"]["met"]]


def _remat_row(results):
    summary = _load(results, "remat_memory_cpu.json")["summary"]
    return (f"memory {summary['memory_ratio']['median']:.2f}, step {summary['step_ratio']['median']:.2f}",
            _MET[summary["met"]])


def _litert_row(runtime, goal):
    def row(results):
        data = _load(results, "export_latency_cpu.json")
        (result,) = [r for r in data["results"] if (r["variant"], r["runtime"]) == ("Ti/16", runtime)]
        return _spread_row(result["speed_up_over_saved_model"], goal)
    return row


def _serving_row(jit_compile):
    """The highest median ratio to Keras' export, p50 or p99, over the export's rows."""
    def row(results):
        rows = [r for r in _load(results, "serving_latency_cpu.json")["results"] if r["runtime"].startswith(
            "keras_vit") and ("--jit_compile" in r["runtime"]) == jit_compile]
        worst = max(r[key]["median"] for r in rows for key in ("p50_vs_keras", "p99_vs_keras"))
        return f"highest {worst:.2f}", _MET[worst <= 1.0]
    return row


def _gpu_row(results):
    data = _load(results, "suite_gpu_jax.json")
    measured, met = _suite_row("suite_gpu_jax.json", r"B/16 (training|inference) batch 256, images/s",
                               "{:,.0f}")(results)
    return f"{measured} ({data['machine']['gpu']})", met


def _both_backends(pattern, fmt="{:.2f}"):
    """One target on TensorFlow (suite_cpu.json) and on Keras' JAX backend (suite_cpu_jax.json), in one row."""
    def row(results):
        found = [(backend, *_suite_row(name, pattern, fmt)(results))
                 for backend, name in (("TF", "suite_cpu.json"), ("JAX", "suite_cpu_jax.json"))]
        measured = "; ".join(f"{backend} {values}" for backend, values, _ in found)
        if len({met for _, _, met in found}) == 1:
            return measured, found[0][2]
        return measured, ", ".join(f"{backend} {met}" for backend, _, met in found)
    return row


def _runtime_row(results):
    """Issue 44's CPU rows: keras_vit's faster served form over the faster runtime, then B/16's memory ratio."""
    speed = _suite_targets(results, "suite_cpu.json",
                           r"(Ti|B)/16 inference batch \d+, keras_vit .*, x the faster runtime")
    (memory,) = _suite_targets(results, "suite_cpu.json", r"B/16 inference batch 8, peak memory, .*")
    return (", ".join(f"{value:.2f}" for value, _ in speed) + f"; memory {memory[0]:.2f}",
            _MET[all(met for _, met in (*speed, memory))])


def _int8_agreement_row(results):
    """The export's default full int8 on each model of benchmarks/int8_agreement.py."""
    rows = [r for r in _load(results, "int8_agreement_cpu.json")["results"] if r["lever"].startswith("default")]
    return ", ".join(f"{r['top1_agreement']:.2%}" for r in rows), _MET[all(r["passes"] for r in rows)]


_BOTH = ("cpu-suite-tensorflow-backend", "cpu-suite-keras-jax-backend")
# (target, how it is measured, sections of docs/performance.md). "x timm": the ratio of images/s to timm's in
# the same rounds. Each row reads the JSON its section renders.
TARGETS = (
    ("Ti/16, S/16 training step >= 0.90 x timm (TF), >= 0.80 x (JAX)",
     _both_backends(r"(Ti|S)/16 training batch 16, keras_vit \w+, x timm"), _BOTH),
    ("TF graph training step >= 0.97 x XLA's",
     _suite_row("suite_cpu.json", r"(Ti|S)/16 training batch 16, keras_vit graph, x keras_vit XLA"),
     "cpu-suite-tensorflow-backend"),
    ("first training step S/16 <= 10 s, B/16 <= 15 s",
     _both_backends(r"[SB]/16 first training step .*", "{:.1f} s"), _BOTH),
    ("B/16 inference batch 1, 8 >= timm",
     _both_backends(r"B/16 inference batch \d+, keras_vit \w+, x timm"), _BOTH),
    ("B/16 inference batch 8 >= 0.90 of the matmul limit",
     _both_backends(r"B/16 inference batch 8, .*, fraction of matmul limit"), _BOTH),
    ("input pipeline >= 1.5 x timm's images per host core", _input_pipeline_row, "training-input-pipeline"),
    ("`remat=True`, B/16 batch 32: memory <= 0.6 x, step <= 1.35 x", _remat_row, "training-memory-remat"),
    ("request p50, p99 <= Keras' `model.export()` (default export)", _serving_row(False), "serving-latency"),
    ("the same, `--jit_compile` export", _serving_row(True), "serving-latency"),
    ("LiteRT fp32, Ti/16 batch 1 >= 2.5 x the SavedModel", _litert_row("tflite none", 2.5), "export-latency"),
    ("LiteRT full int8, Ti/16 batch 1 >= 4 x the SavedModel", _litert_row("tflite int8", 4.0), "export-latency"),
    ("GPU, B/16 batch 256: training >= 1,500, inference >= 5,000 images/s", _gpu_row, "gpu-suite"),
    ("Ti/16, B/16 inference batch 1, 8, keras_vit's fastest served form (XLA, SavedModel, OpenVINO IR) >= the "
     "faster of ONNX Runtime, OpenVINO; B/16 memory <= 1.2 x",
     _runtime_row, "serving-on-a-cpu-keras_vit-timm-onnx-runtime-openvino"),
    ("full int8 top-1 agreement >= 99%: digits, B/16 at 64 px", _int8_agreement_row, "serving.md#tflite"),
)
TARGET_SOURCES = ("suite_cpu.json", "suite_cpu_jax.json", "suite_gpu_jax.json", "input_pipeline_cpu.json",
                  "remat_memory_cpu.json", "serving_latency_cpu.json", "export_latency_cpu.json",
                  "int8_agreement_cpu.json")


def _section_link(section, link):
    """A Markdown link to a section of docs/performance.md (`link`), or to `guide.md#anchor` beside it."""
    if "#" in section:
        guide, anchor = section.split("#")
        return f"[{guide.removesuffix('.md')}]({link.rpartition('/')[0] + '/' if link else ''}{guide}#{anchor})"
    return f"[{_SECTIONS[section]}]({link}#{section})"


def targets_region(link):
    """The speed and memory targets as target, measured, met and a link to the section with the figures behind it."""
    def region(results):
        rows = []
        for target, measure, section in TARGETS:
            measured, met = measure(results)
            sections = (section,) if isinstance(section, str) else section
            rows.append([target, measured, met, ", ".join(_section_link(s, link) for s in sections)])
        return ("How fast keras_vit trains and answers, against the library or runtime you would use instead, "
                "measured in the same run on the same machine: each row's goal, then the ratio measured (CPU: float32, "
                "224 px, 2 cores; TF: the TensorFlow backend, JAX: Keras' JAX backend). Medians over the rounds; the "
                "linked section gives the machine, the date and the spread.\n\n"
                + _table(["target", "measured", "met", "link"], rows))
    return region


REGIONS = {
    "digits-pretraining": digits_pretraining_region,
    "fine-tuning-digits": fine_tuning_digits_region,
    "input-pipeline": input_pipeline_region,
    "remat-memory": remat_memory_region,
    "rope-inference": rope_inference_region,
    "patch-dropout": patch_dropout_region,
    "fewshot-digits": fewshot_region,
    "main-job": main_job_region,
    "main-job-seeds": main_job_seeds_region,
    "cpu-inference": cpu_inference_region,
    "first-call": first_call_region,
    "cpu-training": cpu_training_region,
    "suite-cpu": suite_region("suite_cpu.json", ratios=False),
    "suite-cpu-jax": suite_region("suite_cpu_jax.json"),
    "suite-drift": drift_region(DRIFT_RUNS, "TensorFlow"),
    "suite-drift-jax": drift_region(DRIFT_RUNS_JAX, "Keras' JAX backend"),
    "suite-gpu": suite_region("suite_gpu_jax.json", ratios=False),
    "suite-gpu-h200": suite_region(GPU_H200, ratios=False),
    "gpu": gpu_region,
    "export-latency": export_latency_region,
    "tflite-int8-ops": tflite_int8_ops_region,
    "int8-agreement": int8_agreement_region,
    "litert-converters": litert_converters_region,
    "serving-latency": serving_latency_region,
    "serving-load": serving_load_region,
    "suite-cpu-torch": suite_region("suite_cpu_torch.json"),
    "targets": targets_region(_PERFORMANCE),
    "targets-performance": targets_region(""),
}

# Which result files each region reads (BUILD.md lists them; a test checks every file is read).
SOURCES = {
    "digits-pretraining": ("digits_pretraining.json",),
    "fine-tuning-digits": ("fine_tuning_digits.json",),
    "input-pipeline": ("input_pipeline_cpu.json",),
    "remat-memory": ("remat_memory_cpu.json",),
    "rope-inference": ("rope_inference_cpu.json",),
    "patch-dropout": ("patch_dropout_cpu.json",),
    "fewshot-digits": ("fewshot_digits.json", "fewshot_digits_untrained.json"),
    "main-job": ("main_job_seeds.json",),
    "main-job-seeds": ("main_job_seeds.json",),
    "cpu-inference": ("suite_cpu.json",),
    "first-call": FIRST_CALL_RUNS,
    "cpu-training": ("suite_cpu.json",),
    "suite-cpu": ("suite_cpu.json",),
    "suite-cpu-jax": ("suite_cpu_jax.json",),
    "suite-drift": DRIFT_RUNS,
    "suite-drift-jax": DRIFT_RUNS_JAX,
    "suite-gpu": ("suite_gpu_jax.json",),
    "suite-gpu-h200": (GPU_H200,),
    "gpu": ("suite_gpu_jax.json", GPU_H200, GPU_MATMUL_ATTENTION),
    "export-latency": ("export_latency_cpu.json",),
    "tflite-int8-ops": ("tflite_int8_ops_cpu.json",),
    "int8-agreement": ("int8_agreement_cpu.json",),
    "litert-converters": ("litert_converters_cpu.json",),
    "serving-latency": ("serving_latency_cpu.json",),
    "serving-load": ("serving_load_cpu.json",),
    "suite-cpu-torch": ("suite_cpu_torch.json",),
    "targets": TARGET_SOURCES,
    "targets-performance": TARGET_SOURCES,
}


# --- the files

class FiguresError(ValueError):
    """A region that cannot be read: unknown name, unclosed or stray marker."""


def documents(root):
    """README.md and docs/*.md under `root`, as paths relative to it."""
    root = pathlib.Path(root)
    paths = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    return [p.relative_to(root) for p in paths if p.exists()]


def regions(text, where):
    """[(name, start, end)] of every region in `text`: `start:end` is the text between the two marker lines."""
    found, open_region = [], None
    for match in _REGION.finditer(text):
        closing, name = match.group(1) == "/", match.group(2)
        line = text.count("\n", 0, match.start()) + 1
        if name not in REGIONS:
            raise FiguresError(f"{where}:{line}: unknown region '{name}'; known: {', '.join(sorted(REGIONS))}")
        if not closing:
            if open_region:
                raise FiguresError(f"{where}:{line}: region '{name}' opens inside region '{open_region[0]}'")
            open_region = (name, match.end() + 1)
        else:
            if not open_region or open_region[0] != name:
                raise FiguresError(f"{where}:{line}: '<!-- /figures:{name} -->' closes no open region '{name}'")
            found.append((open_region[0], open_region[1], match.start()))
            open_region = None
    if open_region:
        raise FiguresError(f"{where}: region '{open_region[0]}' is never closed")
    return found


def render(text, results, where):
    """`text` with every region rewritten from the JSON in `results`."""
    pieces, last = [], 0
    for name, start, end in regions(text, where):
        pieces += [text[last:start], "\n" + REGIONS[name](results).strip("\n") + "\n\n"]
        last = end
    return "".join(pieces + [text[last:]])


def stray_figures(text):
    """[(line number, figure)] of benchmark-like figures outside the regions of `text`."""
    spans = [(start, end) for _, start, end in regions(text, "")]
    stray = []
    for match in _STRAY.finditer(text):
        if not any(start <= match.start() < end for start, end in spans):
            stray.append((text.count("\n", 0, match.start()) + 1, match.group(0)))
    return stray


def check(root=ROOT):
    """Problems as lines: each out-of-date region and each figure outside a region."""
    root = pathlib.Path(root)
    results, problems = root / RESULTS, []
    for path in documents(root):
        text = (root / path).read_text()
        try:
            current = render(text, results, path)
        except FiguresError as error:
            problems.append(str(error))
            continue
        rendered = regions(current, path)
        for (name, start, end), (_, new_start, new_end) in zip(regions(text, path), rendered, strict=True):
            if text[start:end] != current[new_start:new_end]:
                problems.append(f"{path}: region '{name}' is out of date (python -m benchmarks.figures)")
        if str(path) not in _NOT_OURS:
            problems += [f"{path}:{line}: '{figure}' is written outside a figures region" for line, figure in
                         stray_figures(text)]
    return problems


def rewrite(root=ROOT):
    """Rewrites every region in place; returns the paths that changed."""
    root = pathlib.Path(root)
    changed = []
    for path in documents(root):
        text = (root / path).read_text()
        new = render(text, root / RESULTS, path)
        if new != text:
            (root / path).write_text(new)
            changed.append(path)
    return changed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 naming what is out of date")
    parser.add_argument("--root", default=str(ROOT), help="the repository (default: this checkout)")
    args = parser.parse_args(argv)
    if args.check:
        problems = check(args.root)
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1 if problems else 0
    try:
        changed = rewrite(args.root)
    except FiguresError as error:
        print(error, file=sys.stderr)
        return 1
    for path in changed:
        print(f"rewrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
