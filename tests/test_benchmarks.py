"""The benchmark scripts run end to end on a tiny configuration (no timing asserted)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).parent.parent


@pytest.mark.parametrize("script, flags, first", [
    ("benchmarks.inference", ["--batch_sizes=1"], "first_call_s"),
    ("benchmarks.training", ["--batch=2", "--skip_digits"], "first_step_s"),
])
def test_benchmark_writes_its_table_and_json(tmp_path, script, flags, first):
    out = tmp_path / "result.json"
    result = subprocess.run(
        [sys.executable, "-m", script, "--variants=Ti/16", "--image_size=32", "--rounds=1", "--seconds=0.05",
         f"--out={out}", *flags], cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "of GEMM" in result.stdout
    payload = json.loads(out.read_text())
    (row,) = payload["results"]
    assert row["xla_on"]["images_per_s"]["median"] > 0 and row["xla_off"][first] > 0
    assert 0 < row["xla_on"]["fraction_of_gemm"]["median"] and payload["machine"]["cores"] >= 1
