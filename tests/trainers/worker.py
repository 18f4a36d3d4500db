"""Runs a tiny digits training in its own process, for the distribution tests.

    python -m tests.trainers.worker MODEL_DIR DATA_DIR MODE OUT.npz [BATCH_SIZE]

MODE is one of one|mirrored|mirrored_defaults|multi_worker. `mirrored` splits
the CPU into two logical devices first (this must happen before TensorFlow
starts, hence a process of its own); `multi_worker` reads TF_CONFIG. The final
weights are written to OUT.npz.
"""

import sys

import numpy as np
import tensorflow as tf

from trainers import loop, train
from trainers.strategy import make_strategy

# The clip binds (the first gradients' norm is about 0.35): replicas must clip their summed gradient.
TINY = dict(hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1, batch_size=16, train_steps=20,
            checkpoint_every=10, steps_per_execution=5, warmup_steps=5, grad_clip_norm=0.1)
# The single-process modes need a few clipped steps over two chunks (a checkpoint between), not 20: one device
# against two compares weights after them, the defaults' run shows XLA turned off and training going.
SHORT = dict(train_steps=10, checkpoint_every=5)


def main(model_dir, data_dir, mode, out, batch_size=TINY["batch_size"]):
    if mode == "mirrored_defaults":  # the recipe's own settings with XLA (a GPU's default), nothing deterministic
        mirrored = tf.distribute.MirroredStrategy(_two_cpus())
        recipe = train.resolve_recipe("digits", {**TINY, **SHORT, "jit_compile": "true", "batch_size": int(batch_size)})
        _, metrics = loop.train(recipe, model_dir, mirrored, "cpu", data_dir)
        np.savez(out, replicas=mirrored.num_replicas_in_sync, top1=metrics["eval_top1"])
        return
    if mode == "mirrored":
        strategy = tf.distribute.MirroredStrategy(_two_cpus())
    elif mode == "multi_worker":
        strategy, _ = make_strategy("multi_worker")
    else:
        strategy = tf.distribute.get_strategy()
    tf.config.experimental.enable_op_determinism()
    short = SHORT if mode in ("one", "mirrored") else {}  # multi_worker: the 20 steps its test reads
    recipe = train.resolve_recipe("digits", {**TINY, **short, "jit_compile": "false", "batch_size": int(batch_size)})
    model, metrics = loop.train(recipe, model_dir, strategy, "cpu", data_dir)
    np.savez(out, replicas=strategy.num_replicas_in_sync, top1=metrics["eval_top1"],
             **{f"w{i}": w for i, w in enumerate(model.get_weights())})


def _two_cpus():
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    return ["/cpu:0", "/cpu:1"]


if __name__ == "__main__":
    main(*sys.argv[1:])
