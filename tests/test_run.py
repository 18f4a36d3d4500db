"""`python -m benchmarks.run --tiny` end to end, timm included (no timing asserted).

The peer environment (benchmarks/.envs/timm, from benchmarks/requirements-peers.txt)
is made on first use, as for a user: the CPU torch wheel and timm from the
package registry.
"""

import json
import os
import sys

import pytest

from benchmarks import run
from tests.processes import run_together

# gpu: bf16, XLA and torch.compile, here on the CPU, on Keras' JAX backend as the lent GPU machines run it
# (its TensorFlow-backend form shares every code path the two cases cover, so CI's time goes elsewhere).
SUITES = [("cpu", "tensorflow"), ("gpu", "jax")]

SERVED = " or ".join(run.SERVED)  # keras_vit's served forms, as the runtime targets name them


def test_tiny_suites_alternate_keras_vit_and_timm_and_write_json(tmp_path):
    run.environment_python("timm", None, run.ENVS_DIR)  # made once, not by two suites racing
    commands, envs = [], []
    for suite, backend in SUITES:  # side by side: each spends most of its time in one process at a time (CI time)
        folder = tmp_path / suite
        folder.mkdir()
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "KERAS_BACKEND": backend}
        if backend == "tensorflow":  # the default: a Keras config naming another backend must not reach the workers
            del env["KERAS_BACKEND"]
            (folder / "keras.json").write_text(json.dumps({"backend": "jax"}))
            env["KERAS_HOME"] = str(folder)
        commands.append([sys.executable, "-m", "benchmarks.run", f"--suite={suite}", "--tiny",
                         f"--out={folder / 'suite.json'}", f"--keras_vit_python={sys.executable}"])
        envs.append(env)
    results = run_together(commands, timeout=1200, envs=envs, cwd=run.ROOT)
    for (suite, backend), result in zip(SUITES, results, strict=True):
        check_tiny_suite(suite, backend, tmp_path / suite, result)


def check_tiny_suite(suite, backend, folder, result):
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    probed = run.shrink(run.SUITES[suite]).probe_workloads
    assert [task for task, _ in probed] == (["training"] if suite == "cpu" else [])
    assert "x timm" in result.stdout and "first call s" in result.stdout
    assert ("peak RSS MB" in result.stdout) == bool(probed)  # the GPU suite probes nothing (BUILD.md)
    payload = json.loads((folder / "suite.json").read_text())
    assert not list(folder.glob("*.tmp*")), "a temporary file was left behind"
    labels = {task: {im.label for im in run.SUITES[suite].implementations if task in im.tasks}
              for task in ("inference", "training")}
    peer = next(im.label for im in run.SUITES[suite].implementations if im.impl == "timm")
    # On the CPU, ONNX Runtime and OpenVINO time their own GEMM (a one-node ONNX model) beside the frameworks'.
    libraries = {"keras_vit", "timm"} | ({"numpy", *run.RUNTIMES} if suite == "cpu" else set())
    runtimes = {im.label for im in run.SUITES[suite].implementations if im.impl in run.RUNTIMES}
    assert bool(runtimes) == (suite == "cpu") and not runtimes & labels["training"]  # they do not train
    assert payload["settings"]["precision"] == run.SUITES[suite].precision
    assert payload["settings"]["xla_flags"] == os.environ.get("XLA_FLAGS", "")  # what the workers inherited
    assert {r["task"] for r in payload["results"]} == {"inference", "training"}
    for result in payload["results"]:
        assert len(result["rounds"]) == 2 and set(result["summary"]) == labels[result["task"]]
        for r in result["rounds"]:
            assert r["limit_gflops"] == max(r["matmul_gflops"].values()) > 0
            assert set(r["matmul_gflops"]) == libraries
            assert all(rate > 0 for rate in r["images_per_s"].values())
        assert result["summary"][peer]["vs_timm"]["median"] == 1.0
        assert set(result["first_call_s_warm_process"]) == labels[result["task"]]
        if runtimes and result["task"] == "inference":  # each row against the faster runtime of its round
            assert max(result["summary"][label]["vs_runtime"]["max"] for label in runtimes) == 1.0
    # --tiny probes one row per worker kind, its first: keras_vit XLA and timm (Suite.probed).
    assert sorted((p["task"], (p["variant"], p["batch"]), p["implementation"]) for p in payload["probes"]) == sorted(
        (task, workload, label) for task, workload in probed for label in ("keras_vit XLA", "timm"))
    assert all(p["peak_rss_mb"] > 100 and p["first_call_s"] > p["compile_s"] for p in payload["probes"])
    assert payload["versions"]["timm"]["timm"] and payload["versions"]["keras_vit"]["backend"] == backend
    assert payload["versions"]["keras_vit"][backend] and "gpu" in payload["machine"]
    assert payload["versions"]["keras_vit"]["device"] == payload["versions"]["timm"]["device"] == "cpu"


def test_tiny_probes_one_implementation_per_worker_kind_and_a_suite_every_one():
    """A probe runs the same code for every row of a worker kind (only the options it passes on differ, which the
    warm workers run): --tiny probes each kind's first row; the suites, every row."""
    suite = run.SUITES["cpu"]
    assert [im.label for im in suite.probed("training")] == [
        "keras_vit XLA", "keras_vit XLA scan", "keras_vit graph", "timm"]
    assert [im.label for im in suite.probed("inference")] == [im.label for im in suite.implementations]
    tiny = run.shrink(suite)
    assert [im.label for im in tiny.probed("training")] == ["keras_vit XLA", "timm"]
    assert [im.label for im in tiny.probed("inference")] == [
        "keras_vit XLA", "keras_vit SavedModel", "keras_vit OpenVINO", "keras_vit ONNX", "timm", "ONNX Runtime",
        "OpenVINO"]


def test_flops_follow_the_stated_formula():
    suite = run.SUITES["cpu"]
    forward = run.flops_per_call("inference", "B/16", 1, suite)
    assert abs(forward / 1e9 - 35.1) < 0.1  # 2 x 17.56 GMACs, the published B/16 figure
    assert run.flops_per_call("training", "B/16", 8, suite) == 3 * 8 * forward


def test_targets_read_the_measurements():
    """Issue 18's CPU targets, on TensorFlow (the test process's backend): inference and training as a user
    runs them there by default (the TF graph), beside XLA's steps."""
    summary = {"keras_vit XLA": {"vs_timm": {"median": 0.9}, "fraction_of_limit": {"median": 0.95}},
               "keras_vit graph": {"vs_timm": {"median": 1.3}, "fraction_of_limit": {"median": 0.8}}}
    training = {"keras_vit XLA": {"vs_timm": {"median": 0.95}, "images_per_s": {"median": 10.0}},
                "keras_vit graph": {"vs_timm": {"median": 0.85}, "images_per_s": {"median": 9.0}}}
    results = [{"task": "inference", "variant": "B/16", "batch": 8, "summary": summary},
               {"task": "training", "variant": "S/16", "batch": 16, "summary": training}]
    probes = [{"task": "training", "variant": variant, "batch": 16, "implementation": label,
               "build_and_first_call_s": seconds}
              for variant, label, seconds in (("S/16", "keras_vit graph", 9.5), ("B/16", "keras_vit graph", 16.0),
                                              ("S/16", "keras_vit XLA", 20.0), ("B/16", "keras_vit XLA", 14.0))]
    checks = {c["target"]: c for c in run.targets(results, probes, "cpu")}
    assert checks["B/16 inference batch 8, keras_vit graph, x timm"]["met"] is True
    assert checks["B/16 inference batch 8, keras_vit graph, fraction of matmul limit"]["measured"] == 0.8
    assert checks["B/16 inference batch 8, keras_vit graph, fraction of matmul limit"]["met"] is False
    assert checks["B/16 inference batch 1, keras_vit graph, x timm"]["met"] is None
    assert checks["S/16 training batch 16, keras_vit graph, x timm"] == {
        "target": "S/16 training batch 16, keras_vit graph, x timm", "measured": 0.85, "goal": 0.90, "met": False}
    assert checks["S/16 training batch 16, keras_vit graph, x keras_vit XLA"]["measured"] == 0.9
    assert checks["S/16 training batch 16, keras_vit graph, x keras_vit XLA"]["met"] is False
    assert checks["Ti/16 training batch 16, keras_vit graph, x timm"]["met"] is None
    # The first step is the default model's (unrolled, the TF graph); XLA's probes are not it.
    assert checks["S/16 first training step (build, trace, compile), keras_vit graph, s"]["measured"] == 9.5
    assert checks["S/16 first training step (build, trace, compile), keras_vit graph, s"]["met"] is True
    assert checks["B/16 first training step (build, trace, compile), keras_vit graph, s"]["met"] is False
    assert checks[f"B/16 inference batch 8, {SERVED}, x the faster runtime"]["met"] is None


def test_runtime_targets_take_keras_vits_faster_served_form_against_the_faster_runtime():
    """Issue 44: each round pairs keras_vit's faster served form with the faster runtime; memory, the leaner form."""
    labels = ("keras_vit XLA", "keras_vit SavedModel", "keras_vit OpenVINO", "keras_vit ONNX", "ONNX Runtime",
              "OpenVINO")
    rates = ((9.0, 10.0, 8.0, 9.5, 8.0, 12.0), (11.0, 9.0, 8.0, 10.5, 10.0, 9.0), (9.0, 9.0, 8.0, 8.5, 10.0, 6.0))
    medians, memory = (9.0, 9.0, 8.0, 9.5, 10.0, 9.0), (1300.0, 1100.0, 1200.0, 1150.0, 1000.0, 500.0)
    for kept in (labels, labels[:3] + labels[4:]):  # a suite's JSON from before the ONNX row: the forms it measured
        rounds = [{"images_per_s": {label: rate for label, rate in zip(labels, row, strict=True) if label in kept}}
                  for row in rates]
        summary = {label: {"images_per_s": {"median": median}} for label, median in zip(labels, medians, strict=True)
                   if label in kept}
        results = [{"task": "inference", "variant": "B/16", "batch": 8, "summary": summary, "rounds": rounds}]
        probes = [{"task": "inference", "variant": "B/16", "batch": 8, "implementation": label, "peak_rss_mb": rss}
                  for label, rss in zip(labels, memory, strict=True) if label in kept]
        checks = {c["target"]: c for c in run.targets(results, probes, "cpu")}
        speed = checks[f"B/16 inference batch 8, {SERVED}, x the faster runtime"]
        assert speed["measured"] == 0.9 and speed["met"] is False  # the rounds' 10/12, 11/10, 9/10
        peak = checks[f"B/16 inference batch 8, peak memory, {SERVED}, x the faster runtime"]
        assert peak["measured"] == 1.1 and peak["met"] is True  # against ONNX Runtime, the faster by median
    assert checks[f"Ti/16 inference batch 1, {SERVED}, x the faster runtime"]["met"] is None


def test_gpu_targets_are_images_per_second():
    summary = {"keras_vit XLA": {"images_per_s": {"median": 1600.0}}}
    results = [{"task": "training", "variant": "B/16", "batch": 256, "summary": summary}]
    checks = {c["target"]: c["met"] for c in run.targets(results, [], "gpu")}
    assert checks == {"B/16 training batch 256, images/s": True, "B/16 inference batch 256, images/s": None}


def test_a_dying_worker_is_reported_with_its_output():
    worker = run.WorkerProcess(sys.executable, "no_such_side", threads=1)  # argparse refuses it and exits
    worker.process.wait()
    with pytest.raises(RuntimeError, match=r"(?s)exited \(code 2\).*invalid choice: 'no_such_side'"):
        worker.ask("versions")


class _Answering:
    """A worker that answers `versions` only."""

    def __init__(self, device):
        self.device = device

    def ask(self, op, **arguments):
        assert op == "versions", op  # nothing is prepared or timed before the devices are checked
        return {"versions": {"device": self.device}}


def test_a_worker_that_sees_no_gpu_stops_the_suite_on_a_gpu_machine():
    suite = run.shrink(run.SUITES["gpu"])
    workers = {"keras_vit": _Answering("cpu"), "timm": _Answering("NVIDIA H200")}
    with pytest.raises(SystemExit, match=r"has a GPU \(NVIDIA H200\), but keras_vit sees none"):
        run.measure_all(workers, suite, gpu="NVIDIA H200")
    with pytest.raises(AssertionError, match="prepare"):  # a CPU machine: no check
        run.measure_all(workers, suite, gpu=None)


def test_alternating_rounds_start_one_call_further_on_each_round_when_asked(monkeypatch):
    from benchmarks import common

    monkeypatch.setattr(common, "gemm_gflops", lambda: 1.0)
    for rotate, expected in ((False, "abcabcabc"), (True, "abcbcacab")):
        order = []
        samples, gemms = common.alternating_rounds({k: k for k in "abc"}, 3, order.append, rotate=rotate)
        assert "".join(order) == expected and gemms == [1.0] * 3 and samples == {k: [None] * 3 for k in "abc"}
