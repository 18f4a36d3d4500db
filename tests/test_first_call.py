"""`python -m benchmarks.first_call --tiny` end to end, timm included (no timing asserted).

The end-to-end run makes one repeat (three fresh processes: each keras_vit row and timm's); the summaries over
several repeats are checked on made-up runs (`test_the_summaries_are_of_the_runs_paired_within_each_run`), which
is all `main` does with them: a second repeat would only start the same three processes again.
"""

import json
import os
import subprocess
import sys

import pytest

from benchmarks import first_call, run

FUSED, INSTANCE = first_call.OPTIMIZERS["string"], first_call.OPTIMIZERS["instance"]


def test_tiny_first_call_splits_the_stages_in_fresh_processes_and_writes_json(tmp_path):
    run.environment_python("timm", None, run.ENVS_DIR)  # made once, as in tests/test_run.py
    out = tmp_path / "first_call.json"
    result = subprocess.run([sys.executable, "-m", "benchmarks.first_call", "--tiny", "--variants=S/16",
                             "--steady_steps=1", "--repeats=1", f"--out={out}"], cwd=run.ROOT, capture_output=True,
                            text=True, timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "first call (build to first step)" in result.stdout and "x timm's" in result.stdout
    payload = json.loads(out.read_text())
    assert not list(tmp_path.glob("*.tmp*")), "a temporary file was left behind"
    assert payload["settings"] == {"batch": 16, "image_size": 32, "num_layers": 1, "threads": 2, "steady_steps": 1,
                                   "repeats": 1}
    (measured,) = payload["results"]
    assert measured["variant"] == "S/16" and measured["numpy_gemm_gflops"]["min"] > 0
    (rows,) = measured["runs"]
    assert set(rows) == {FUSED, INSTANCE, "timm"}
    # The string and an instance of Keras' AdamW both train with the fused AdamW.
    assert rows[FUSED]["optimizer"] == rows[INSTANCE]["optimizer"] == "keras_vit.optimizers.AdamW"
    for label in (FUSED, INSTANCE):
        row = rows[label]
        assert all(row[stage] > 0 for stage in first_call.STAGES), row
        assert row["total_s"] == pytest.approx(row["build_s"] + row["compile_s"] + row["trace_s"] + row["first_run_s"])
        assert set(row["cpu_s"]) == {"build_s", "compile_s", "trace_s", "first_run_s", "total_s"}
        assert row["cpu_s"]["total_s"] > row["cpu_s"]["trace_s"] > 0
        assert row["trainable_variables"] == 24  # a block 16; patches 2, class token, positions, norm 2, head 2
    assert rows["timm"]["total_s"] > rows["timm"]["first_run_s"] > 0
    assert measured == first_call.summarize("S/16", [measured["numpy_gemm_gflops"]["min"]], [rows])


def test_the_summaries_are_of_the_runs_paired_within_each_run():
    def rows(fused, instance, timm, fused_cpu, instance_cpu):
        stages = {stage: 1.0 for stage in first_call.STAGES}
        return {FUSED: {**stages, "total_s": fused, "cpu_s": {"total_s": fused_cpu}, "steady_s": fused / 10},
                INSTANCE: {**stages, "total_s": instance, "cpu_s": {"total_s": instance_cpu}, "steady_s": 0.5},
                "timm": {"total_s": timm, "first_run_s": 0.5, "build_s": 0.5, "steady_s": timm / 8}}

    # Paired within each run: the ratios of the pooled medians (3 / 3, 3 / 3) would be 1.
    runs = [rows(2.0, 4.0, 1.0, 1.0, 4.0), rows(6.0, 3.0, 3.0, 3.0, 2.0), rows(3.0, 2.0, 6.0, 2.0, 1.0)]
    measured = first_call.summarize("S/16", [10.0, 30.0, 20.0], runs)
    assert measured["runs"] == runs and measured["numpy_gemm_gflops"] == {"median": 20.0, "min": 10.0, "max": 30.0}
    assert measured["rows"][FUSED]["total_s"] == {"median": 3.0, "min": 2.0, "max": 6.0}
    assert set(measured["rows"][FUSED]) == set(first_call.STAGES)
    assert measured["rows"]["timm"]["total_s"] == {"median": 3.0, "min": 1.0, "max": 6.0}
    assert set(measured["rows"]["timm"]) == {"total_s", "first_run_s", "build_s", "steady_s"}
    assert measured["total_vs_instance"] == {"median": 1.5, "min": 0.5, "max": 2.0}
    assert measured["total_vs_timm"] == {"median": 2.0, "min": 0.5, "max": 2.0}
    assert measured["cpu_total_vs_instance"] == {"median": 1.5, "min": 0.25, "max": 2.0}
    # timm's step over ours, paired within each run: 0.125 / 0.2, 0.375 / 0.6, 0.75 / 0.3
    assert measured["speed_vs_timm"][FUSED] == pytest.approx({"median": 0.625, "min": 0.625, "max": 2.5})
    assert measured["speed_vs_timm"][INSTANCE] == pytest.approx({"median": 0.75, "min": 0.25, "max": 1.5})


def test_max_isa_holds_every_framework_and_the_machine_records_it(monkeypatch):
    from benchmarks import common

    monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=0 --xla_cpu_max_isa=AVX512")
    limits = common.isa_limits("AVX2")
    assert limits == {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2",
                      "XLA_FLAGS": "--xla_backend_optimization_level=0 --xla_cpu_max_isa=AVX2"}  # one max_isa, kept
    for name, value in limits.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    machine = common.machine()
    assert machine["isa_settings"] == {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2",
                                       "TF_ENABLE_ONEDNN_OPTS": "0", "--xla_cpu_max_isa=AVX2": True}
    if "cpu_family" in machine:  # Linux: the CPU's own widest vector ISA, whatever the settings hold it to
        assert machine["isa"] in ("AVX512F", "AVX2", "AVX", "OTHER")
        assert machine["avx512"] == (machine["isa"] == "AVX512F")
