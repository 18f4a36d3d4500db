"""`python -m benchmarks.first_call --tiny` end to end, timm included (no timing asserted)."""

import json
import os
import subprocess
import sys

import pytest

from benchmarks import first_call, run


def test_tiny_first_call_splits_the_stages_in_fresh_processes_and_writes_json(tmp_path):
    run.environment_python("timm", None, run.ENVS_DIR)  # made once, as in tests/test_run.py
    out = tmp_path / "first_call.json"
    result = subprocess.run([sys.executable, "-m", "benchmarks.first_call", "--tiny", "--variants=S/16",
                             "--steady_steps=1", "--repeats=2", f"--out={out}"], cwd=run.ROOT, capture_output=True,
                            text=True, timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "first call (build to first step)" in result.stdout and "x timm's" in result.stdout
    payload = json.loads(out.read_text())
    assert not list(tmp_path.glob("*.tmp*")), "a temporary file was left behind"
    assert payload["settings"] == {"batch": 16, "image_size": 32, "num_layers": 1, "threads": 2, "steady_steps": 1,
                                   "repeats": 2}
    (measured,) = payload["results"]
    assert measured["variant"] == "S/16" and measured["numpy_gemm_gflops"]["min"] > 0
    assert len(measured["runs"]) == 2
    fused, instance = first_call.OPTIMIZERS["string"], first_call.OPTIMIZERS["instance"]
    for rows in measured["runs"]:
        assert set(rows) == {fused, instance, "timm"}
        # The string gives the fused AdamW; an instance keeps Keras' own.
        assert rows[fused]["optimizer"] == "keras_vit.optimizers.AdamW"
        assert rows[instance]["optimizer"] == "keras.src.optimizers.adamw.AdamW"
        for label in (fused, instance):
            row = rows[label]
            assert all(row[stage] > 0 for stage in first_call.STAGES), row
            assert row["total_s"] == pytest.approx(row["build_s"] + row["compile_s"] + row["trace_s"]
                                                   + row["first_run_s"])
            assert set(row["cpu_s"]) == {"build_s", "compile_s", "trace_s", "first_run_s", "total_s"}
            assert row["cpu_s"]["total_s"] > row["cpu_s"]["trace_s"] > 0
            assert row["trainable_variables"] == 24  # a block 16; patches 2, class token, positions, norm 2, head 2
        assert rows["timm"]["total_s"] > rows["timm"]["first_run_s"] > 0
    # The summaries are of the runs: each stage's median and range, and the ratios paired within each run.
    totals = [rows[fused]["total_s"] for rows in measured["runs"]]
    assert measured["rows"][fused]["total_s"] == {"median": pytest.approx(sum(totals) / 2), "min": min(totals),
                                                  "max": max(totals)}
    ratios = [rows[fused]["total_s"] / rows["timm"]["total_s"] for rows in measured["runs"]]
    assert measured["total_vs_timm"]["min"] == pytest.approx(min(ratios))
