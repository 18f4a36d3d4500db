"""Runs tiny digits trainings on Keras' JAX backend over two host CPU devices, for tests/trainers/test_jax_trainer.py.

    KERAS_BACKEND=jax XLA_FLAGS=--xla_force_host_platform_device_count=2 \
        python -m tests.trainers.jax_trainer_worker OUT_DIR DATA_DIR

Each mode trains in OUT_DIR/MODE (its model_dir) and writes OUT_DIR/MODE.npz: the batch's shards, the devices
and the final weights; a mode that raises writes OUT_DIR/MODE.error (its type and message, then the traceback).

    one             --strategy=cpu: one device, whole batches
    data_parallel   both devices, each batch in two accumulated micro-batches
    model_parallel  both devices on the model axis: the attention's and the MLP's kernels split in two
    resumed         one's run again from its first checkpoint (the later one and the final files taken away)
    indivisible     num_heads=3 under model_parallel: refused before any file is written
    deit            the distilled DeiT under data_parallel, its teacher a .keras ViT; evaluations only at the end
    saved_model_teacher  a SavedModel teacher: refused (TensorFlow's graph cannot run in JAX's step)
"""

import pathlib
import shutil
import sys
import traceback

import keras
import numpy as np

import keras_vit
from trainers import jax_distribution, loop, train

# As tests/trainers/worker.py's one-device against mirrored modes: clipped AdamW steps over two chunks (a
# checkpoint between), layer decay and the EMA on.
TINY = dict(hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1, batch_size=16, train_steps=10,
            checkpoint_every=5, steps_per_execution=5, warmup_steps=5, grad_clip_norm=0.1, layer_decay=0.75,
            ema_decay=0.9, validation_fraction=0)
MODES = {"one": ("cpu", {}), "data_parallel": ("data_parallel", {"grad_accumulation_steps": 2}),
         "model_parallel": ("model_parallel", {}), "resumed": ("cpu", {}),
         "indivisible": ("model_parallel", {"num_heads": 3, "hidden_size": 36, "mlp_dim": 65}),
         "deit": ("data_parallel", {"classifier": "token", "distilled": True, "distillation": "hard"}),
         "saved_model_teacher": ("cpu", {"classifier": "token", "distilled": True, "distillation": "hard"})}


def run_mode(mode, out, data_dir):
    strategy_name, fields = MODES[mode]
    if mode == "deit":
        keras_vit.ViT(patch_size=2, hidden_size=16, mlp_dim=32, num_heads=2, num_layers=1, image_size=8, classes=10,
                      input_shape=(8, 8, 1)).save(out / "teacher.keras")
        fields = {**fields, "teacher": str(out / "teacher.keras")}
    if mode == "saved_model_teacher":
        (out / "saved_model").mkdir()
        (out / "saved_model" / "saved_model.pb").write_bytes(b"")
        fields = {**fields, "teacher": str(out / "saved_model")}
    recipe = train.resolve_recipe("digits", {**TINY, **fields})
    if mode == "resumed":  # the first checkpoint left as the last one written
        shutil.copytree(out / "one", out / mode)
        for name in ("model.keras", "model.npz", "metrics.json", "checkpoints/ckpt-10.npz"):
            (out / mode / name).unlink()
        (out / mode / "checkpoints" / "checkpoint").write_text("ckpt-5\n")
    strategy = jax_distribution.make_distribution(strategy_name, 0, recipe.model)
    model, metrics = loop.train(recipe, out / mode, strategy, strategy.kind, data_dir)
    return {"shards": strategy.num_replicas_in_sync, "devices": metrics["devices"], "backend": metrics["backend"],
            "accumulating": "_accumulate_on_jax" in model.train_step.__qualname__,
            **{f"w{i}": keras.ops.convert_to_numpy(w) for i, w in enumerate(model.weights)}}


def main(out, data_dir):
    out = pathlib.Path(out)
    for mode in MODES:
        print(f"=== {mode}", file=sys.stderr, flush=True)
        keras.backend.clear_session()
        try:
            np.savez(out / f"{mode}.npz", **run_mode(mode, out, data_dir))
        except Exception as error:  # noqa: BLE001 -- reported to the test, which names it
            (out / f"{mode}.error").write_text(f"{type(error).__name__}: {error}\n{traceback.format_exc()}")
        sys.stderr.flush()


if __name__ == "__main__":
    main(*sys.argv[1:])
