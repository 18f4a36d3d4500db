"""`remat=True`: the same gradients as without, dropout and stochastic depth included (their masks redrawn
the same in the recomputation), unrolled and scanned, with and without XLA."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_vit

FIELDS = dict(patch_size=2, hidden_size=16, mlp_dim=32, num_heads=2, num_layers=3, image_size=8, classes=4,
              classifier="token")


def _gradients(remat, jit_compile, **fields):
    """Two training steps' gradients of a model seeded the same whatever `remat` is."""
    keras.utils.set_random_seed(0)
    model = keras_vit.ViT(classifier_activation=None, remat=remat, **FIELDS, **fields)
    x = np.random.default_rng(0).uniform(-1, 1, (4, 8, 8, 3)).astype("float32")
    y = np.eye(4, dtype="float32")

    @tf.function(jit_compile=jit_compile)
    def step():
        with tf.GradientTape() as tape:
            loss = keras.losses.categorical_crossentropy(y, model(x, training=True), from_logits=True)
        return tape.gradient(loss, [v.value for v in model.trainable_variables])

    return [g.numpy() for g in (*step(), *step())]


STOCHASTIC = dict(dropout_rate=0.2, attention_dropout_rate=0.2, drop_path_rate=0.3)


@pytest.mark.parametrize("fields, jit_compile",
                         [(STOCHASTIC, False), (STOCHASTIC, True), (dict(scan_layers=True), False),
                          (dict(STOCHASTIC, layer_scale_init=0.5), False),
                          (dict(scan_layers=True, layer_scale_init=0.5), False)],
                         ids=["unrolled-stochastic", "unrolled-stochastic-xla", "scanned", "layer-scale-stochastic",
                              "layer-scale-scanned"])
def test_remat_gives_the_same_gradients(fields, jit_compile):
    plain, recomputed = _gradients(False, jit_compile, **fields), _gradients(True, jit_compile, **fields)
    assert max(np.abs(g).max() for g in plain) > 0.1
    for a, b in zip(plain, recomputed, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_remat_is_inference_neutral_and_saved():
    keras.utils.set_random_seed(0)
    plain = keras_vit.ViT(**FIELDS)
    remat = keras_vit.ViT(remat=True, **FIELDS)
    remat.set_weights(plain.get_weights())
    x = np.random.default_rng(1).uniform(-1, 1, (2, 8, 8, 3)).astype("float32")
    np.testing.assert_allclose(plain(x), remat(x), rtol=1e-6)
    assert remat.get_layer("encoder_block_0").get_config()["remat"] is True


def test_scanned_remat_refuses_stochastic_layers():
    with pytest.raises(ValueError, match="remat=True with scan_layers=True needs dropout_rate"):
        keras_vit.ViTConfig(remat=True, scan_layers=True, drop_path_rate=0.1)
