"""Trains the distilled DeiT and the MPP tasks on a tiny digits ViT under MirroredStrategy over two logical CPUs.

    python -m tests.trainers.task_worker OUT_DIR DATA_DIR

The teacher is a `keras.applications` CNN (MobileNetV3Small, untrained: its
answers are a fixed function of the image, which the student can learn)
saved as `.keras`. After MPP, the digits recipe starts from its `model.npz`
for a few steps (on the default strategy). Writes OUT_DIR/{deit,mpp,finetune}/
and OUT_DIR/replicas.txt.
"""

import pathlib
import sys

import keras
import tensorflow as tf

from trainers import loop, train

# Four chunks of 5 steps (four epoch_loss points) for DeiT and MPP; evaluations only at the end.
TINY = dict(hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1, batch_size=16, train_steps=20,
            checkpoint_every=5, steps_per_execution=5, warmup_steps=5)
DIGITS = dict(dataset="keras_vit_digits", eval_split="test", patch_size=2, image_size=8, train_crop="resize",
              flip=False, eval_crop_fraction=1.0, mixed_precision="float32", optimizer="adamw", learning_rate=2e-3)


def main(out, data_dir):
    out = pathlib.Path(out)
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    teacher = keras.applications.MobileNetV3Small(input_shape=(32, 32, 3), weights=None, classes=10,
                                                  minimalistic=True, include_preprocessing=True)
    teacher.save(out / "teacher.keras")
    deit = train.resolve_recipe("digits", {**TINY, "classifier": "token", "distilled": True, "distillation": "hard",
                                           "teacher": str(out / "teacher.keras")})
    loop.train(deit, out / "deit", strategy, "cpu", data_dir, eval_every=0)
    mpp = train.resolve_recipe("mpp_pretrain", {**TINY, **DIGITS, "classifier": "gap", "learning_rate": 5e-3})
    loop.train(mpp, out / "mpp", strategy, "cpu", data_dir, eval_every=0)
    finetune = train.resolve_recipe("digits", {**TINY, "train_steps": 10, "checkpoint_every": 10,
                                               "pretrained": str(out / "mpp" / "model.npz")})
    loop.train(finetune, out / "finetune", tf.distribute.get_strategy(), "cpu", data_dir)
    (out / "replicas.txt").write_text(str(strategy.num_replicas_in_sync))


if __name__ == "__main__":
    main(*sys.argv[1:])
