"""Every kind of keras_vit model is served by TF Serving's C++ loader as Keras computes it.

Each export below went through the exporter's own proof (a fresh process
loading it with the C API and replaying the warm-up records of every
signature against Keras, 1e-5); the test then asks the C++-loaded export
itself for `predict_float` on a new input and compares with the Keras model
called directly.
"""

import keras
import numpy as np
import pytest

import keras_vit
from export import capi, saved_model
from tests.layer_checks import randomize_weights

TINY = dict(patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2, image_size=16, classes=3,
            classifier_activation=None)
# Each kind at least once: both classifiers, every position embedding, a
# hybrid, scanned layers, any image size (a model trained in mixed_bfloat16 below).
CASES = {
    "gap, learned_2d": dict(classifier="gap", position_embedding="learned_2d"),
    "token, relative, scan_layers": dict(position_embedding="relative", scan_layers=True),
    "gap, relative_2d": dict(classifier="gap", position_embedding="relative_2d"),
    "token, sincos_2d, dynamic_image_size": dict(position_embedding="sincos_2d", dynamic_image_size=True),
    "gap, none, hybrid": dict(classifier="gap", position_embedding="none", resnet_num_layers=(1,), patch_size=1,
                              resnet_width_factor=1, image_size=32),
}


def check_served(model, path, size):
    inputs = np.random.default_rng(1).uniform(-1, 1, (2, size, size, 3)).astype(np.float32)
    session = capi.SavedModelSession(path)
    try:
        served = session.run("predict_float", inputs=inputs)["probabilities"]
    finally:
        session.close()
    # model.predict: the Keras answer a user gets (a traced function, as the server's graph is).
    expected = keras.ops.convert_to_numpy(keras.ops.softmax(model.predict(inputs, verbose=0).astype(np.float32)))
    np.testing.assert_allclose(served, expected, atol=1e-5)
    assert np.abs(expected - 1 / 3).max() > 0.01  # weights that move the answer


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_each_kind_of_model_is_served_as_keras_computes_it(case, tmp_path):
    model = keras_vit.ViT(**{**TINY, **CASES[case]})
    randomize_weights(model, scale=0.3)
    path = saved_model.export_saved_model(model, tmp_path, name="vit")
    check_served(model, path, CASES[case].get("image_size", 16))
    if model.vit_config.dynamic_image_size:  # any size of whole patches; another is refused, not cropped
        check_served(model, path, 24)
        session = capi.SavedModelSession(path)
        try:
            refused = r"divisible by `patch_size`=\(8, 8\); received\] \[20 20\]"
            with pytest.raises(capi.TFError, match=refused) as error:
                session.run("predict_float", inputs=np.zeros((1, 20, 20, 3), np.float32))
            assert error.value.code == 3  # INVALID_ARGUMENT, what TF Serving returns to the client
        finally:
            session.close()


@pytest.mark.slow
def test_a_model_trained_in_mixed_bfloat16_is_served_as_keras_computes_it(tmp_path):
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    model = keras_vit.ViT(**TINY, representation_size=16)
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    # Ten steps: the head starts at zero, and check_served wants weights that move the answer.
    model.fit(rng.uniform(-1, 1, (8, 16, 16, 3)), rng.integers(0, 3, 8), epochs=10, verbose=0)
    model.save(tmp_path / "m.keras")
    keras.mixed_precision.set_global_policy("float32")  # the exporter loads what the file says
    loaded = keras_vit.load_model(tmp_path / "m.keras")
    assert loaded.get_layer("encoder_block_0").compute_dtype == "bfloat16"
    path = saved_model.export_saved_model(loaded, tmp_path / "serving", name="vit")
    check_served(loaded, path, 16)
