"""keras_vit on Keras' JAX backend, without TensorFlow: the layers are `keras.ops`
throughout, and the lent GPU machines (which cannot install TensorFlow) run the
GPU benchmark this way (BUILD.md)."""

import subprocess
import sys

import numpy as np
import pytest

import keras_vit
from tests.layer_checks import randomize_weights

# Dropout and stochastic depth on: they must be inactive at inference and run in training.
CONFIG = dict(patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2, image_size=16, classes=3,
              classifier_activation=None, dropout_rate=0.1, drop_path_rate=0.1)
COTANGENT = np.random.default_rng(1).normal(size=(4, 3)).astype("float32")


def _gradients(model, images):
    import tensorflow as tf  # here: tests.jax_backend_worker imports this module without TensorFlow

    with tf.GradientTape() as tape:
        objective = tf.reduce_sum(model(images, training=False) * COTANGENT)
    variables = model.trainable_variables
    gradients = tape.gradient(objective, variables)
    return {v.path: tf.convert_to_tensor(g).numpy() for v, g in zip(variables, gradients, strict=True)}


@pytest.mark.slow
def test_jax_backend_gives_the_tensorflow_logits_and_gradients_and_trains(tmp_path):
    images = np.random.default_rng(0).uniform(-1, 1, (4, 16, 16, 3)).astype("float32")
    unrolled = keras_vit.ViT(**CONFIG)
    randomize_weights(unrolled, scale=0.2)
    scanned = keras_vit.ViT(**CONFIG, scan_layers=True)
    keras_vit.load_npz(scanned, keras_vit.save_npz(unrolled, tmp_path / "m.npz"))
    for name, model in (("unrolled", unrolled), ("scan", scanned)):
        model.save_weights(tmp_path / f"{name}.weights.h5")
    np.save(tmp_path / "images.npy", images)
    result = subprocess.run(
        [sys.executable, "-m", "tests.jax_backend_worker", str(tmp_path), str(tmp_path / "images.npy"),
         str(tmp_path / "out.npz")], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    out = np.load(tmp_path / "out.npz")
    assert str(out["backend"]) == "jax" and not out["tensorflow_imported"]
    expected = np.asarray(unrolled(images))
    assert out["boundary_is_exact"]
    # The unrolled blocks' gradients cross a `gradient_boundary` each on JAX's CPU (a conditional);
    # the scanned encoder runs one block program, so one conditional.
    assert int(out["unrolled_conditionals"]) == CONFIG["num_layers"]
    assert int(out["scan_conditionals"]) == 1
    for name, model in (("unrolled", unrolled), ("scan", scanned)):
        np.testing.assert_allclose(out[f"{name}_logits"], expected, atol=1e-5, err_msg=name)
        tf_gradients = _gradients(model, images)
        jax_gradients = {k.split(":", 1)[1]: out[k] for k in out.files if k.startswith(f"{name}_grad:")}
        assert sorted(jax_gradients) == sorted(tf_gradients)
        for path, gradient in tf_gradients.items():
            np.testing.assert_allclose(jax_gradients[path], gradient, rtol=1e-4, atol=1e-6, err_msg=path)
        losses = out[f"{name}_losses"]
        assert np.isfinite(losses).all() and losses[-1] < losses[0], (name, losses)
