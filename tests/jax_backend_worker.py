"""Runs keras_vit on Keras' JAX backend with TensorFlow unimportable (tests/test_jax_backend.py).

    python -m tests.jax_backend_worker WEIGHTS_DIR IMAGES.npy OUT.npz

For each `<name>.weights.h5` in WEIGHTS_DIR (saved by the TensorFlow backend
from `tests.test_jax_backend.CONFIG` with `scan_layers=<name> == "scan"`), writes
the logits on the images, the gradient of `sum(logits * cotangent)` for every
trainable variable (by path), how many conditionals that gradient's program has
(`gradient_boundary`'s), and the losses of three jit-compiled AdamW steps. Then
whether `gradient_boundary` passes gradients through bit for bit, zeros, NaNs and
infinities included, in every float dtype.
"""

import os
import pathlib
import sys

os.environ["KERAS_BACKEND"] = "jax"


class _NoTensorFlow:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "tensorflow":
            raise ImportError("TensorFlow is kept out of this process")


sys.meta_path.insert(0, _NoTensorFlow())

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_vit  # noqa: E402
from keras_vit.layers.gradient_boundary import gradient_boundary  # noqa: E402
from tests.test_jax_backend import CONFIG, COTANGENT  # noqa: E402


def gradients(model, images):
    """{path: d sum(logits * COTANGENT) / d variable} at inference, and the gradient's jaxpr."""
    trainable = [v.value for v in model.trainable_variables]
    fixed = [v.value for v in model.non_trainable_variables]

    def objective(values):
        logits, _ = model.stateless_call(values, fixed, images, training=False)
        return (logits * COTANGENT).sum()

    traced = jax.jit(jax.grad(objective)).trace(trainable)  # traced once: run, and its program read
    values = traced.lower().compile()(trainable)
    return {v.path: np.asarray(g) for v, g in zip(model.trainable_variables, values, strict=True)}, traced.jaxpr


def boundary_is_exact():
    """The boundary's gradient equals the incoming one for first elements of every kind."""
    exact = True
    for dtype in ("float32", "bfloat16", "float16"):
        for first in (0.0, -0.0, np.nan, np.inf, -np.inf, 1e-45, -1.0):
            incoming = jax.numpy.asarray([first, 2.0, -3.0], dtype=dtype)
            _, pullback = jax.vjp(gradient_boundary, jax.numpy.ones(3, dtype))
            (outgoing,) = jax.jit(pullback)(incoming)
            exact &= outgoing.dtype == incoming.dtype and np.array_equal(
                np.asarray(outgoing, "float32"), np.asarray(incoming, "float32"), equal_nan=True)
    return exact


def main(weights_dir, images_path, out_path):
    images = np.load(images_path)
    out = {"backend": keras.backend.backend()}
    for weights in sorted(pathlib.Path(weights_dir).glob("*.weights.h5")):
        name = weights.name.split(".")[0]
        # Dropout and stochastic depth draw from Keras' global seed: fixed, so
        # the loss-must-fall check sees the same three steps on every run.
        keras.utils.set_random_seed(0)
        model = keras_vit.ViT(**CONFIG, scan_layers=name == "scan")
        model.load_weights(weights)
        out[f"{name}_logits"] = keras.ops.convert_to_numpy(model(images))
        grads, jaxpr = gradients(model, images)
        out.update({f"{name}_grad:{path}": g for path, g in grads.items()})
        out[f"{name}_conditionals"] = str(jaxpr).count(" cond[")
        model.compile(optimizer=keras.optimizers.AdamW(1e-2), jit_compile=True,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        labels = np.arange(len(images)) % CONFIG["classes"]
        out[f"{name}_losses"] = [float(model.train_on_batch(images, labels)) for _ in range(3)]
    out["boundary_is_exact"] = boundary_is_exact()
    out["tensorflow_imported"] = any(m.split(".")[0] == "tensorflow" for m in sys.modules)
    np.savez(out_path, **out)


if __name__ == "__main__":
    main(*sys.argv[1:])
