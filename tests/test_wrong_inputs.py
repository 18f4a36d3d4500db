"""Inputs the library once took without a word or crashed on: each now answers, refuses or warns, naming it."""

import logging
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from keras_vit import checkpoints
from tests.backends.backend_checks import WAYS, WRONG_SHAPES, grey_model

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


# A grey 8x8 model (patch 2): tests/backends/backend_checks.py runs the same cases on JAX and PyTorch.
GREY = "(None, 8, 8, 1)"


def _refusal(received, expected=GREY):
    return re.escape(f"expects inputs of shape {expected} (batch, height, width, channels); received shape {received}")


def _images(shape, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)


@pytest.fixture(scope="module")
def grey():
    model = grey_model()
    for way in WAYS.values():  # traces of right shapes first, of two batch sizes, as a user's session has
        for count in (2, 3):
            way(model, _images((count, 8, 8, 1)))
    return model


@pytest.mark.parametrize("way", list(WAYS))
@pytest.mark.parametrize("case", list(WRONG_SHAPES))
def test_an_input_of_the_wrong_shape_is_one_value_error_naming_both_shapes(grey, case, way):
    # Keras' own check let (n, 8, 8) and RGB through (it adds or drops a last axis of 1) and predict said
    # "as_list() is not defined on an unknown TensorShape" or printed ~200 lines of TensorFlow's stack.
    shape = WRONG_SHAPES[case]
    for _ in range(2):  # the same answer the second time
        with pytest.raises(ValueError, match=r"^The model 'vit\S*' " + _refusal(shape)) as error:
            WAYS[way](grey, _images(shape))
        assert "\n" not in str(error.value)


@pytest.mark.parametrize("failed", [(2, 8, 8), (2, 8, 8, 3), None])
def test_after_a_failed_call_another_size_is_refused_not_answered(failed):
    # The regression: Keras' predict_function is a tf.function with reduce_retracing, so a call of another
    # shape (failed or not) traced it again with the sizes, or the rank, unknown; that trace then took a 28x28
    # image into the 8x8 model, resampled the position table to its 14x14 grid and gave scores without a word.
    model = grey_model()
    right = _images((2, 8, 8, 1))
    expected = keras.ops.convert_to_numpy(model(right))
    model.predict(right, verbose=0)
    if failed:
        with pytest.raises(ValueError, match=_refusal(failed)):
            model.predict(_images(failed), verbose=0)
    for way in WAYS.values():
        with pytest.raises(ValueError, match=_refusal((2, 28, 28, 1))):
            way(model, _images((2, 28, 28, 1)))
    dataset = tf.data.Dataset.from_tensor_slices(_images((4, 28, 28, 1))).batch(2)
    with pytest.raises(ValueError, match=_refusal((None, 28, 28, 1))):  # checked before Keras traces
        model.predict(dataset, verbose=0)
    np.testing.assert_allclose(model.predict(right, verbose=0), expected, atol=1e-6)
    np.testing.assert_allclose(model.predict_on_batch(right), expected, atol=1e-6)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_a_traced_function_checks_sizes_it_leaves_unknown_when_it_runs(jit_compile):
    # Inside a user's tf.function (or a signature of any shape) the sizes are unknown while tracing: the model
    # checks them when the graph runs, also under XLA, and the layers see the static sizes.
    model = grey_model()
    forward = tf.function(lambda x: model(x), reduce_retracing=True, jit_compile=jit_compile)
    right = _images((2, 8, 8, 1))
    np.testing.assert_allclose(forward(right), model(right), atol=1e-6)
    forward(_images((3, 8, 8, 1)))
    for shape in ((2, 28, 28, 1), (2, 8, 8)):
        with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(
                f"[{','.join(map(str, shape))}] is not compatible with expected shape [?,8,8,1]")):
            forward(_images(shape))
    any_shape = tf.function(lambda x: model(x), input_signature=[tf.TensorSpec(None, tf.float32)])
    np.testing.assert_allclose(any_shape(right), model(right), atol=1e-6)
    with pytest.raises(tf.errors.InvalidArgumentError, match="is not compatible with expected shape"):
        any_shape(_images((2, 28, 28, 1)))


def test_a_dynamic_size_model_takes_any_size_of_whole_patches_and_refuses_the_rest(tmp_path):
    built = keras_vit.ViT(patch_size=2, hidden_size=16, mlp_dim=32, num_heads=2, num_layers=1, classes=3,
                          input_shape=(None, None, 1), dynamic_image_size=True)
    built.save(tmp_path / "dynamic.keras")
    dynamic = "(None, None, None, 1)"
    refusals = {(2, 8, 8, 3): _refusal((2, 8, 8, 3), dynamic), (2, 8, 8): _refusal((2, 8, 8), dynamic),
                (2, 9, 8, 1): re.escape("divisible by `patch_size`=(2, 2); received shape (2, 9, 8, 1)")}
    for model in (built, keras.saving.load_model(tmp_path / "dynamic.keras")):
        for shape in ((2, 8, 8, 1), (2, 28, 28, 1), (3, 12, 6, 1), (2, 8, 8, 1)):
            images = _images(shape)
            expected = keras.ops.convert_to_numpy(model(images))
            assert expected.shape == (shape[0], 3)
            np.testing.assert_allclose(model.predict(images, verbose=0), expected, atol=1e-6)
            np.testing.assert_allclose(model.predict_on_batch(images), expected, atol=1e-6)
        for shape, message in refusals.items():
            for way in WAYS.values():
                with pytest.raises(ValueError, match=message):
                    way(model, _images(shape))


def test_a_loaded_fixed_size_model_refuses_another_size(tmp_path):
    grey_model().save(tmp_path / "grey.keras")
    loaded = keras_vit.load_model(tmp_path / "grey.keras")
    loaded.predict(_images((2, 8, 8, 1)), verbose=0)
    for way in WAYS.values():
        with pytest.raises(ValueError, match=_refusal((2, 28, 28, 1))):
            way(loaded, _images((2, 28, 28, 1)))
