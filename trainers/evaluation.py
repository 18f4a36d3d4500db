"""Evaluation during training: when to stop for it, top-1/top-5 to TensorBoard, and the best checkpoint.

The best checkpoint (highest validation top-1) lives in `model_dir/best`
beside the last ones in `model_dir/checkpoints`; `model_dir/best.json`
records its step and metrics, so a resumed run keeps comparing against it.
"""

import json
import os

import tensorflow as tf

from keras_vit.atomic_files import write_text_atomically


def next_stop(step, recipe, eval_every):
    """The next step at which the loop checkpoints, evaluates or ends (a pure function of `step`)."""
    stops = [recipe.train_steps, (step // recipe.checkpoint_every + 1) * recipe.checkpoint_every]
    if eval_every:
        stops.append((step // eval_every + 1) * eval_every)
    return min(stops)


class Evaluation:
    """Evaluates on one split and writes top-1, top-5 and loss to TensorBoard under `log_dir`."""

    def __init__(self, model, dataset, log_dir, is_chief):
        self.model, self.dataset = model, dataset
        self.writer = tf.summary.create_file_writer(str(log_dir)) if is_chief else tf.summary.create_noop_writer()

    def __call__(self, step):
        results = self.model.evaluate(self.dataset, verbose=0, return_dict=True)
        with self.writer.as_default(step=step):
            for name in ("top1", "top5", "loss"):
                tf.summary.scalar(name, results[name])
        self.writer.flush()
        return results


class BestCheckpoint:
    """Saves a checkpoint into `checkpoints` (`model_dir/best`, `trainers.checkpointing`; two kept: the one
    best.json names survives until best.json names the next, whenever the run stops) whenever the evaluation
    top-1 beats the best so far."""

    def __init__(self, checkpoints, model_dir, is_chief):
        self.checkpoints = checkpoints
        self.record_path = model_dir / "best.json"
        self.is_chief = is_chief
        self.record = (json.loads(self.record_path.read_text()) if self.record_path.exists()
                       else {"step": None, "eval_top1": -1.0})

    def consider(self, step, results):
        """Keeps the checkpoint when `results` is the best yet; returns a line for the log."""
        line = (f"eval at step {step}: top-1 {results['top1']:.4f}  top-5 {results['top5']:.4f}  "
                f"loss {results['loss']:.4f}")
        if results["top1"] <= self.record["eval_top1"]:
            line = f"{line}  (best: {self.record['eval_top1']:.4f} at step {self.record['step']})"
        else:
            self.checkpoints.save(step)
            self.record = {"step": step, "eval_top1": results["top1"], "eval_top5": results["top5"],
                           "eval_loss": results["loss"],
                           "checkpoint": os.path.basename(self.checkpoints.latest)}
            line = f"{line}  (new best, saved to {self.checkpoints.directory.name}/)"
        self.record["last_evaluated_step"] = step
        if self.is_chief:
            write_text_atomically(self.record_path, json.dumps(self.record, indent=2))
        return line

    @property
    def last_evaluated_step(self):
        """The step of the last evaluation considered (a record from before this field: its best step, or 0)."""
        return self.record.get("last_evaluated_step", self.record["step"] or 0)
