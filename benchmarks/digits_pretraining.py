"""DeiT distillation and MPP pre-training against training from scratch, on the embedded digits.

Every arm trains the digits recipe's ViT for the same total number of steps
(`--steps`), each run a `python -m trainers.train` process of its own, over
`--seeds`:

- scratch: the digits recipe (global average pooling), and its class-token form;
- hard / soft distillation from a small CNN teacher trained here on the digits
  training split (saved as `.keras`; soft at the paper's tau 3, alpha 0.1);
- hard distillation with DeiT's distillation token (class-token model);
- MPP: `mpp_pretrain`'s objective on the digits images for half the steps, then
  the digits recipe from its `model.npz` for the other half.

    python -m benchmarks.digits_pretraining [--steps=2000] [--seeds=0,1,2] [--out=...]
"""

import pathlib
import statistics
import tempfile
import time

from absl import app, flags

from benchmarks import common

_STEPS = flags.DEFINE_integer("steps", 2000, "Training steps of every arm (MPP: pre-training + fine-tuning).")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds of every arm.")
_OUT = flags.DEFINE_string("out", "benchmarks/results/digits_pretraining.json", "Where to write the JSON.")

# The digits recipe's schedule scaled to the run: warm-up 100 of its 4000 steps.
DIGITS_MPP = ["--recipe=mpp_pretrain", "--dataset=keras_vit_digits", "--eval_split=test", "--patch_size=2",
              "--hidden_size=64", "--mlp_dim=128", "--num_heads=4", "--num_layers=4", "--image_size=8",
              "--classifier=gap", "--drop_path_rate=0.1", "--representation_size=0", "--train_crop=resize",
              "--flip=false", "--eval_crop_fraction=1.0", "--random_shift=1", "--optimizer=adamw",
              "--learning_rate=2e-3", "--weight_decay=0.05", "--batch_size=64", "--steps_per_execution=25",
              "--mixed_precision=float32"]


def train_teacher(folder, data_dir, seed=0):
    """A 3-layer CNN on the digits training split, saved as `.keras`; returns (path, test top-1)."""
    import keras
    import numpy as np

    from trainers import data

    def arrays(split):
        source = data.load("keras_vit_digits", split, data_dir)
        examples = list(source.dataset.as_numpy_iterator())
        return np.stack([image for image, _ in examples]).astype("float32"), np.array([label for _, label in examples])

    keras.utils.set_random_seed(seed)
    (x, y), (x_test, y_test) = arrays("train"), arrays("test")
    teacher = keras.Sequential([
        keras.Input((8, 8, 1)), keras.layers.Rescaling(1 / 255),
        keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(128, 3, padding="same", activation="relu"), keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(256, 3, padding="same", activation="relu"), keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dropout(0.3), keras.layers.Dense(10)], name="digits_cnn")
    epochs, batch = 100, 64
    schedule = keras.optimizers.schedules.CosineDecay(1e-3, epochs * -(-len(x) // batch))
    teacher.compile(keras.optimizers.Adam(schedule), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                    metrics=["accuracy"])
    teacher.fit(x, y, batch_size=batch, epochs=epochs, verbose=0)
    path = pathlib.Path(folder) / "teacher.keras"
    teacher.save(path)
    return str(path), float(teacher.evaluate(x_test, y_test, verbose=0)[1])


def arms(steps, teacher):
    """{name: [[flags of each stage]]}: one stage, or MPP's two (pre-training, then fine-tuning).

    Every arm trains on the whole training split (`--validation_fraction=0`): the comparison reports each final
    model's test top-1 and selects nothing, so no validation split is needed.
    """
    common_flags = [f"--train_steps={steps}", f"--warmup_steps={steps // 40}", "--validation_fraction=0"]
    token = ["--classifier=token"]
    distil = [f"--teacher={teacher}", "--teacher_outputs=logits"]
    half = steps // 2
    return {
        "scratch": [common_flags],
        "scratch, class token": [common_flags + token],
        "hard distillation": [common_flags + distil + ["--distillation=hard"]],
        "soft distillation (tau 3, alpha 0.1)": [common_flags + distil + [
            "--distillation=soft", "--distillation_temperature=3", "--distillation_alpha=0.1"]],
        "hard distillation, distillation token": [common_flags + token + distil + [
            "--distillation=hard", "--distilled=true"]],
        "MPP then fine-tuning": [DIGITS_MPP + [f"--train_steps={half}", f"--warmup_steps={half // 40}",
                                               "--validation_fraction=0"],
                                 # --recipe: with --pretrained alone the trainer takes vit_finetune's (ImageNet).
                                 ["--recipe=digits", f"--train_steps={half}", f"--warmup_steps={half // 40}",
                                  "--pretrained={mpp}", "--validation_fraction=0"]],
    }


def run_arm(stages, seed, folder, data_dir):
    start, metrics, previous = time.perf_counter(), None, None
    for index, stage in enumerate(stages):
        model_dir = pathlib.Path(folder) / f"run-{time.monotonic_ns()}-{index}"
        stage = [f.format(mpp=previous) for f in stage]
        metrics = common.train_metrics(model_dir, f"--data_dir={data_dir}", f"--seed={seed}", *stage)
        previous = model_dir / "model.npz"
    return {"seed": seed, "test_top1": metrics["eval_top1"], "seconds": time.perf_counter() - start}


def main(argv):
    del argv
    seeds = [int(s) for s in _SEEDS.value]
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        data_dir = str(pathlib.Path(folder) / "tfds")
        teacher, teacher_top1 = train_teacher(folder, data_dir)
        print(f"teacher (CNN): test top-1 {teacher_top1:.4f}")
        for name, stages in arms(_STEPS.value, teacher).items():
            runs = [run_arm(stages, seed, folder, data_dir) for seed in seeds]
            top1 = [r["test_top1"] for r in runs]
            results[name] = {"runs": runs, "mean": statistics.mean(top1), "min": min(top1), "max": max(top1)}
            print(f"{name}: test top-1 {results[name]['mean']:.4f} ({min(top1):.4f}-{max(top1):.4f})")
    common.write_json(_OUT.value, {"machine": common.machine(), "steps": _STEPS.value, "seeds": seeds,
                                   "teacher_top1": teacher_top1, "results": results})
    print(f"wrote {_OUT.value}")


if __name__ == "__main__":
    app.run(main)
