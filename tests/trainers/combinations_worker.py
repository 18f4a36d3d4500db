"""Trains one tiny ViT per combination under MirroredStrategy on two logical CPUs.

    python -m tests.trainers.combinations_worker OUT.json [SHARD COUNT]

Its own process: the CPU must be split into two logical devices before
TensorFlow starts. Each combination trains a few steps on one fixed batch
and reports its losses. With SHARD and COUNT, only every COUNT-th
combination from the SHARD-th: shards run in processes side by side.
"""

import json
import sys

import keras
import numpy as np
import tensorflow as tf

import keras_vit

POSITION_EMBEDDINGS = ("learned_1d", "learned_2d", "relative", "relative_2d", "sincos_2d", "none")
# Binary settings (scan_layers, mixed_bfloat16, drop_path, dropout) per position embedding, with
# the token classifier; the GAP model of the same embedding takes their complement. Together the
# 12 runs cover every pair of values of every two factors (tests/trainers/test_combinations.py checks).
PATTERNS = ((0, 0, 0, 0), (0, 1, 1, 1), (1, 0, 1, 1), (1, 1, 0, 1), (1, 1, 1, 0), (0, 0, 1, 1))
STEPS = 4


def combinations():
    for embedding, pattern in zip(POSITION_EMBEDDINGS, PATTERNS, strict=True):
        for classifier, bits in (("token", pattern), ("gap", [1 - b for b in pattern])):
            scan, bfloat16, drop_path, dropout = bits
            yield dict(position_embedding=embedding, classifier=classifier, scan_layers=bool(scan),
                       precision="mixed_bfloat16" if bfloat16 else "float32",
                       drop_path_rate=0.1 * drop_path, dropout_rate=0.1 * dropout)


def train(strategy, combination, images, labels):
    keras.mixed_precision.set_global_policy(combination["precision"])
    keras.utils.set_random_seed(0)
    fields = {k: v for k, v in combination.items() if k != "precision"}
    with strategy.scope():
        model = keras_vit.ViT(patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2, image_size=16,
                              classes=3, classifier_activation=None, **fields)
        # Without XLA, as the trainer runs a multi-device MirroredStrategy: Keras 3 compiles the whole
        # strategy.run as one XLA cluster, which cannot read variables on two devices (BUILD.md).
        model.compile(keras.optimizers.AdamW(3e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      jit_compile=False)
    dataset = tf.data.Dataset.from_tensors((images, labels)).repeat(STEPS)
    model.fit(dataset, epochs=1, steps_per_epoch=STEPS, verbose=0, shuffle=False, callbacks=[Losses()])
    return model.losses_seen


class Losses(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.model.losses_seen = []

    def on_train_batch_end(self, batch, logs=None):
        self.model.losses_seen.append(float(logs["loss"]))


def main(out, shard=0, count=1):
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    rng = np.random.default_rng(0)
    images = rng.uniform(-1, 1, (8, 16, 16, 3)).astype(np.float32)
    labels = rng.integers(0, 3, 8)
    shard_combinations = list(combinations())[shard::count]
    results = [{**c, "losses": train(strategy, c, images, labels)} for c in shard_combinations]
    with open(out, "w") as f:
        json.dump({"replicas": strategy.num_replicas_in_sync, "results": results}, f)


if __name__ == "__main__":
    main(sys.argv[1], *map(int, sys.argv[2:]))
