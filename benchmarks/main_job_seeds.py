"""The main job's test accuracy over seeds: the README's figure, as a fresh clone reproduces it.

Runs `python -m trainers.train --recipe=digits --seed=S` for each seed in a
fresh model directory (each a process of its own, as a user runs it; the same
seed run twice shows whether a run repeats), and writes every run's test top-1
(the final model's, evaluated once: the run selects on its validation split)
with the mean and range.

    python -m benchmarks.main_job_seeds [--seeds=0,1,2,3,4] [--repeat_first] [--out=...]
"""

import pathlib
import statistics
import tempfile
import time

from absl import app, flags

from benchmarks import common

_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2", "3", "4"], "Seeds to train with (0 is the default's).")
_REPEAT = flags.DEFINE_bool("repeat_first", True, "Run the first seed twice, to show a run repeats.")
_OUT = flags.DEFINE_string("out", "benchmarks/results/main_job_seeds.json", "Where to write the JSON.")


def run_once(seed, folder):
    model_dir = pathlib.Path(folder) / f"seed{seed}-{time.monotonic_ns()}"
    start = time.perf_counter()
    metrics = common.train_metrics(model_dir, "--recipe=digits", f"--seed={seed}")
    return {"seed": int(seed), "test_top1": metrics["eval_top1"], "test_top5": metrics["eval_top5"],
            "validation_top1": metrics["validation_top1"], "best_step": metrics["best_step"],
            "step": metrics["step"], "seconds": time.perf_counter() - start}


def main(argv):
    del argv
    seeds = [int(s) for s in _SEEDS.value]
    plan = seeds + (seeds[:1] if _REPEAT.value else [])
    with tempfile.TemporaryDirectory() as folder:
        runs = [run_once(seed, folder) for seed in plan]
    for run in runs:
        print(f"seed {run['seed']}: test top-1 {run['test_top1']:.4f} ({run['seconds']:.0f} s)")
    distinct = {r["seed"]: r["test_top1"] for r in runs[: len(seeds)]}
    top1 = list(distinct.values())
    summary = {"mean": statistics.mean(top1), "min": min(top1), "max": max(top1), "seeds": len(top1)}
    repeat = runs[-1]["test_top1"] == runs[0]["test_top1"] if _REPEAT.value else None
    print(f"mean {summary['mean']:.4f}, range {summary['min']:.4f}-{summary['max']:.4f} over {len(top1)} seeds; "
          f"seed {seeds[0]} repeated exactly: {repeat}")
    common.write_json(_OUT.value, {"machine": common.machine(), "runs": runs, "summary": summary,
                                   "first_seed_repeats": repeat})
    print(f"wrote {_OUT.value}")


if __name__ == "__main__":
    app.run(main)
