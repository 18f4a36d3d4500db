"""Runs keras_vit on Keras' JAX backend with TensorFlow unimportable (tests/test_jax_backend.py).

    python -m tests.jax_backend_worker WEIGHTS_DIR IMAGES.npy OUT.npz

For each `<name>.weights.h5` in WEIGHTS_DIR (saved by the TensorFlow backend
from `tests.test_jax_backend.CONFIG` with `scan_layers=<name> == "scan"`), writes
the logits on the images, and the losses of three jit-compiled AdamW steps.
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

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_vit  # noqa: E402
from tests.test_jax_backend import CONFIG  # noqa: E402


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
        model.compile(optimizer=keras.optimizers.AdamW(1e-2), jit_compile=True,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        labels = np.arange(len(images)) % CONFIG["classes"]
        out[f"{name}_losses"] = [float(model.train_on_batch(images, labels)) for _ in range(3)]
    out["tensorflow_imported"] = any(m.split(".")[0] == "tensorflow" for m in sys.modules)
    np.savez(out_path, **out)


if __name__ == "__main__":
    main(*sys.argv[1:])
