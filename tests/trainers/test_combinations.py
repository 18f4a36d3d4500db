"""Every combination of the model's training options trains under MirroredStrategy (issue 14, point 3)."""

import itertools
import json
import math
import os
import pathlib
import sys

import pytest

from tests.processes import run_together
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
    # Two shards side by side: each run is mostly tracing, one core's work (CI time).
    shards = [[sys.executable, "-m", "tests.trainers.combinations_worker", str(tmp_path / f"{shard}.json"), str(shard),
               "2"] for shard in range(2)]
    for result in run_together(shards, timeout=900, cwd=ROOT, env=env):
        assert result.returncode == 0, result.stderr[-3000:]
    reports = [json.loads((tmp_path / f"{shard}.json").read_text()) for shard in range(2)]
    assert all(report["replicas"] == 2 for report in reports)
    runs = [run for report in reports for run in report["results"]]
    trained = [{k: v for k, v in run.items() if k != "losses"} for run in runs]
    assert len(trained) == 12 and all(c in trained for c in combinations_worker.combinations())
    for run in runs:
        first, last = run["losses"][0], run["losses"][-1]
        # The head starts at zero, so the first loss is ln(3) exactly; then it must fall.
        assert abs(first - math.log(3)) < 1e-3, run
        assert last < first - 0.02, run
