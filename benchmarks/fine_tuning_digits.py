"""Layer-wise learning-rate decay and the weight EMA, fine-tuning the digits' MPP model (issue 52).

For each of `--seeds`: `benchmarks.digits_pretraining`'s MPP arm, as that script runs it: `mpp_pretrain` on the
digits images for half of `--steps`, then the digits recipe from its `model.npz` for the other half, here four
times from the same pre-trained model:

- plain: the digits recipe;
- layer decay: `--layer_decay=0.75` (timm's default);
- EMA: `--ema_decay=0.999`, its warm-up on (the trainer's default);
- both.

The fine-tunes hold out the digits recipe's validation split (`--validation_fraction`) and evaluate it every
`--eval_every` steps, for the best validation top-1; the test top-1 is the final model's (the average with the
EMA). Each run is a `python -m trainers.train` process of its own.

    python -m benchmarks.fine_tuning_digits [--steps=2000] [--seeds=0,1,2] [--out=...]
"""

import pathlib
import statistics
import tempfile
import time

from absl import app, flags

from benchmarks import common, digits_pretraining

# --steps, --seeds and --out are digits_pretraining's flags (importing it defines them); --out's default is ours.
_STEPS, _SEEDS, _OUT = digits_pretraining._STEPS, digits_pretraining._SEEDS, digits_pretraining._OUT
OUT = "benchmarks/results/fine_tuning_digits.json"
_VALIDATION = flags.DEFINE_float("validation_fraction", 0.1, "Training images the fine-tunes hold out for validation "
                                 "(the digits recipe's).")
_EVAL_EVERY = flags.DEFINE_integer("eval_every", 100, "Fine-tuning steps between validation evaluations.")

ARMS = {
    "plain": [],
    "layer decay 0.75": ["--layer_decay=0.75"],
    "EMA 0.999": ["--ema_decay=0.999"],
    "layer decay 0.75 + EMA 0.999": ["--layer_decay=0.75", "--ema_decay=0.999"],
}


def stages(steps, validation_fraction, eval_every):
    """(pre-training flags, fine-tuning flags): digits_pretraining's MPP arm, its fine-tune with a validation split.

    The fine-tune names the digits recipe: with `--pretrained` and no `--recipe` the trainer takes vit_finetune.
    """
    pretraining, fine_tuning = digits_pretraining.arms(steps, teacher=None)["MPP then fine-tuning"]
    fine_tuning = [f for f in fine_tuning if not f.startswith("--validation_fraction=")]
    return pretraining, ["--recipe=digits", *fine_tuning, f"--validation_fraction={validation_fraction}",
                         f"--eval_every={eval_every}"]


def _timed(model_dir, *flags_):
    start = time.perf_counter()
    metrics = common.train_metrics(model_dir, *flags_)
    return metrics, time.perf_counter() - start


def _summary(values):
    return {"mean": statistics.mean(values), "min": min(values), "max": max(values)}


def main(argv):
    del argv
    seeds = [int(s) for s in _SEEDS.value]
    pretraining, fine_tuning = stages(_STEPS.value, _VALIDATION.value, _EVAL_EVERY.value)
    start = time.perf_counter()
    pretrained, runs, examples = [], {name: [] for name in ARMS}, {}
    with tempfile.TemporaryDirectory() as folder:
        data_dir = f"--data_dir={pathlib.Path(folder) / 'tfds'}"
        for seed in seeds:
            mpp_dir = pathlib.Path(folder) / f"mpp-{seed}"
            metrics, seconds = _timed(mpp_dir, data_dir, f"--seed={seed}", *pretraining)
            pretrained.append({"seed": seed, "patch_top1": metrics["eval_top1"], "seconds": seconds})
            print(f"seed {seed}: MPP pre-training, patch colour top-1 {metrics['eval_top1']:.4f}, {seconds:.0f} s")
            for index, (name, extra) in enumerate(ARMS.items()):
                stage = [f.format(mpp=mpp_dir / "model.npz") for f in fine_tuning]
                metrics, seconds = _timed(pathlib.Path(folder) / f"tune-{seed}-{index}", data_dir, f"--seed={seed}",
                                          *stage, *extra)
                examples = {"test": metrics["eval_examples"], "validation": metrics["validation_examples"]}
                runs[name].append({"seed": seed, "test_top1": metrics["eval_top1"],
                                   "best_validation_top1": metrics["best_top1"], "best_step": metrics["best_step"],
                                   "final_validation_top1": metrics["validation_top1"], "seconds": seconds})
                print(f"seed {seed}: {name}: test top-1 {metrics['eval_top1']:.4f}, best validation top-1 "
                      f"{metrics['best_top1']:.4f} (step {metrics['best_step']}), {seconds:.0f} s")
    wall = time.perf_counter() - start
    results = {name: {"flags": ARMS[name], "runs": arm, **_summary([r["test_top1"] for r in arm]),
                      "best_validation": _summary([r["best_validation_top1"] for r in arm])}
               for name, arm in runs.items()}
    rows = [{"arm": name, "test mean": f"{r['mean']:.2%}", "range": f"{r['min']:.2%}-{r['max']:.2%}",
             "per seed": ", ".join(f"{run['test_top1']:.2%}" for run in r["runs"]),
             "best val mean": f"{r['best_validation']['mean']:.2%}",
             "best val range": f"{r['best_validation']['min']:.2%}-{r['best_validation']['max']:.2%}"}
            for name, r in results.items()]
    print()
    common.print_table(rows, list(rows[0]))
    print(f"\n{wall:.0f} s in all")
    half = _STEPS.value // 2
    common.write_json(_OUT.value, {
        "machine": common.machine(), "steps": {"pretraining": half, "fine_tuning": half}, "seeds": seeds,
        "validation_fraction": _VALIDATION.value, "eval_every": _EVAL_EVERY.value, "examples": examples,
        "pretraining_flags": pretraining, "fine_tuning_flags": fine_tuning, "pretraining": pretrained,
        "results": results, "wall_s": wall})
    print(f"wrote {_OUT.value}")


if __name__ == "__main__":
    flags.FLAGS.set_default("out", OUT)
    app.run(main)
