"""Inputs the library once took without a word or crashed on: each now answers, refuses or warns, naming it."""

import logging

import numpy as np
import pytest

import keras_vit
from keras_vit import checkpoints

TINY = dict(patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1, image_size=16, classes=3)


@pytest.fixture(scope="module")
def model():
    return keras_vit.ViT(**TINY)


def _pixels(count=2, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (count, 16, 16, 3)).astype(np.float32)


def test_an_empty_batch_gives_an_empty_answer(model):
    # Keras' predict failed with UnboundLocalError; a call, with a shape error in PatchEmbedding
    # (TensorFlow's Conv2D returns an empty batch unchanged).
    empty = np.zeros((0, 16, 16, 3), np.float32)
    assert model.predict(empty, verbose=0).shape == (0, 3)
    assert tuple(model(empty).shape) == (0, 3)
    headless = keras_vit.ViT(**TINY, include_top=False)
    assert headless.predict(empty, verbose=0).shape == (0, *headless.output_shape[1:])


def test_predict_refuses_raw_pixels_naming_both_ranges(model):
    with pytest.raises(ValueError, match=r"ViTModel.predict's images must be model inputs, scaled by "
                                         r"`keras_vit.preprocess_input\(pixels, config=model.vit_config\)` to "
                                         r"\[-1, 1\]; received values from 0 to 255 \(raw pixels\?\)"):
        model.predict(_pixels(), verbose=0)
    with pytest.raises(ValueError, match="received values from nan"):
        model.predict(np.full((1, 16, 16, 3), np.nan, np.float32), verbose=0)
    scaled = keras_vit.preprocess_input(_pixels())
    np.testing.assert_allclose(model.predict(scaled, verbose=0), model(scaled), atol=1e-5)
    assert model.predict(_pixels(), verbose=0, check_input_range=False).shape == (2, 3)  # opted out


def test_predict_warns_on_images_scaled_twice(model, caplog):
    twice = keras_vit.preprocess_input(keras_vit.preprocess_input(_pixels()))
    with caplog.at_level(logging.WARNING):
        model.predict(twice, verbose=0)
    assert "preprocess_input applied twice?" in caplog.text and "0.8% of the model's input range" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        model.predict(keras_vit.preprocess_input(_pixels()), verbose=0)
    assert "twice" not in caplog.text


def test_imagenet_normalised_models_check_their_own_range():
    config = keras_vit.ViTConfig(**TINY, input_mean=keras_vit.config.IMAGENET_MEAN,
                                 input_std=keras_vit.config.IMAGENET_STD)
    model = keras_vit.ViT(config)
    assert model.predict(keras_vit.preprocess_input(_pixels(), config=config), verbose=0).shape == (2, 3)
    with pytest.raises(ValueError, match=r"to \[-2.118, 2.64\]; received values from 0 to 255"):
        model.predict(_pixels(), verbose=0)


def test_numpy_integers_are_ints():
    model = keras_vit.ViT(**{**TINY, "classes": np.int64(10), "num_layers": np.int32(1)})
    assert model.output_shape == (None, 10) and type(model.vit_config.classes) is int


def test_one_channel_adapts_the_default_mean_and_std():
    # The default 0.5 for every channel was blamed: "`input_mean` must hold 1 finite floats".
    model = keras_vit.ViT(**TINY, channels=1)
    assert model.input_shape == (None, 16, 16, 1)
    assert model.vit_config.input_mean == (0.5,) and model.vit_config.input_std == (0.5,)
    with pytest.raises(ValueError, match=r"`input_mean` must hold 1 finite floats"):  # a mean per channel: not guessed
        keras_vit.ViTConfig(**TINY, channels=1, input_mean=keras_vit.config.IMAGENET_MEAN)


def _poisoned(model, layer="head"):
    weight = model.get_layer(layer).weights[0]
    value = np.asarray(weight.numpy())
    value.flat[3] = np.nan
    weight.assign(value)
    return model


def test_save_npz_refuses_nan_weights_naming_them(tmp_path):
    model = _poisoned(keras_vit.ViT(**TINY))
    with pytest.raises(ValueError, match=r"The model '.*' holds NaN or infinite values in 1 array\(s\): "
                                         r"\['head/kernel'\].*nothing was written"):
        checkpoints.save_npz(model, tmp_path / "m.npz")
    assert not list(tmp_path.iterdir())


def test_load_npz_and_from_checkpoint_refuse_nan_or_infinite_weights(tmp_path):
    path = checkpoints.save_npz(keras_vit.ViT(**TINY), tmp_path / "m.npz")
    arrays = dict(np.load(path))
    arrays["embedding/kernel"] = np.where(np.arange(arrays["embedding/kernel"].size).reshape(
        arrays["embedding/kernel"].shape) == 5, np.inf, arrays["embedding/kernel"])
    arrays["head/bias"] = np.full_like(arrays["head/bias"], np.nan)
    np.savez(tmp_path / "bad.npz", **arrays)
    message = (r"The checkpoint .*bad.npz holds NaN or infinite values in 2 array\(s\): "
               r"\['embedding/kernel', 'head/bias'\]")
    model = keras_vit.ViT(**TINY)
    before = [np.asarray(w) for w in model.weights]
    with pytest.raises(ValueError, match=message + ".*nothing was loaded"):
        checkpoints.load_npz(model, tmp_path / "bad.npz")
    assert all(np.array_equal(a, np.asarray(w)) for a, w in zip(before, model.weights, strict=True))
    with pytest.raises(ValueError, match=message):
        keras_vit.ViT.from_checkpoint(tmp_path / "bad.npz")
    # Without a head the bad head is not loaded, and only the embedding is named.
    with pytest.raises(ValueError, match=r"in 1 array\(s\): \['embedding/kernel'\]"):
        checkpoints.load_npz(keras_vit.ViT(**TINY, include_top=False), tmp_path / "bad.npz")
