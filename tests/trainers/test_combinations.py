"""Every combination of the model's training options trains under MirroredStrategy (issue 14, point 3)."""

import itertools
import json
import os
import pathlib
import subprocess
import sys

import pytest

from tests.trainers import combinations_worker

ROOT = pathlib.Path(__file__).parents[2]
FACTORS = ("position_embedding", "classifier", "scan_layers", "precision", "drop_path_rate", "dropout_rate")


def test_the_runs_cover_every_pair_of_values_of_every_two_factors():
    runs = list(combinations_worker.combinations())
    values = {f: {run[f] for run in runs} for f in FACTORS}
    assert values["position_embedding"] == set(combinations_worker.POSITION_EMBEDDINGS)
    assert all(len(values[f]) == 2 for f in FACTORS[1:])
    for a, b in itertools.combinations(FACTORS, 2):
        assert {(run[a], run[b]) for run in runs} == set(itertools.product(values[a], values[b])), (a, b)


@pytest.mark.slow
def test_every_combination_trains_on_two_logical_devices(tmp_path):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-m", "tests.trainers.combinations_worker", str(tmp_path / "out.json")],
                            cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "out.json").read_text())
    assert report["replicas"] == 2 and len(report["results"]) == 12
    for run in report["results"]:
        first, last = run["losses"][0], run["losses"][-1]
        # The head starts at zero, so the first loss is ln(3) exactly; then it must fall.
        assert abs(first - report["uniform_loss"]) < 1e-3, run
        assert last < first - 0.02, run
