import keras
import numpy as np
import pytest

import keras_vit
from tests.layer_checks import randomize_weights

TINY = dict(patch_size=4, hidden_size=16, mlp_dim=32, num_heads=2, num_layers=1, image_size=8, classes=3)
IMAGES = np.random.default_rng(0).uniform(-1, 1, (2, 8, 8, 3)).astype("float32")


def test_a_keras_file_loads_as_it_was_saved(tmp_path):
    model = keras_vit.ViT(**TINY)
    randomize_weights(model)
    model.save(tmp_path / "m.keras")
    loaded = keras_vit.load_model(tmp_path / "m.keras", classifier_activation=None)  # the file keeps its softmax
    assert isinstance(loaded, keras_vit.ViTModel) and loaded.vit_config == model.vit_config
    np.testing.assert_array_equal(np.asarray(loaded(IMAGES)), np.asarray(model(IMAGES)))
    with pytest.raises(ValueError, match=r"loaded as it was saved; received changes \['image_size'\]"):
        keras_vit.load_model(tmp_path / "m.keras", image_size=16)


def test_a_keras_file_without_a_vit_config_is_refused_with_the_way_to_save_it_again(tmp_path):
    model = keras_vit.ViT(**TINY)
    randomize_weights(model)
    keras.Model(model.input, model.output).save(tmp_path / "old.keras")  # as keras_vit saved before ViTModel
    with pytest.raises(ValueError, match=r"old.keras holds a Keras model without a ViTConfig") as error:
        keras_vit.load_model(tmp_path / "old.keras")
    assert "keras_vit.ViTModel(old.input, old.output, vit_config=config).save('new.keras')" in str(error.value)
    # The way the message names works.
    old = keras.models.load_model(tmp_path / "old.keras")
    keras_vit.ViTModel(old.input, old.output, vit_config=model.vit_config).save(tmp_path / "new.keras")
    again = keras_vit.load_model(tmp_path / "new.keras")
    assert again.vit_config == model.vit_config
    np.testing.assert_array_equal(np.asarray(again(IMAGES)), np.asarray(model(IMAGES)))


def test_a_checkpoint_is_built_from_its_file_with_the_head_asked_for(tmp_path):
    model = keras_vit.ViT(**TINY, classifier_activation=None)
    randomize_weights(model)
    path = keras_vit.save_npz(model, tmp_path / "m.npz")
    logits = keras_vit.load_model(path, classifier_activation=None)
    np.testing.assert_allclose(np.asarray(logits(IMAGES)), np.asarray(model(IMAGES)), atol=1e-6)
    probabilities = np.asarray(keras_vit.load_model(path)(IMAGES))
    np.testing.assert_allclose(probabilities, np.asarray(keras.ops.softmax(model(IMAGES))), atol=1e-6)
    bigger = keras_vit.load_model(path, image_size=16)
    assert bigger.vit_config.image_size == (16, 16)
