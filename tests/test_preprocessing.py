import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from keras_vit import ViTConfig, preprocess_input
from keras_vit.preprocessing import input_config, input_range, native_image_size


def test_maps_uint8_pixels_to_minus_one_one():
    out = preprocess_input(np.array([0, 127.5, 255]).astype("float32"))
    np.testing.assert_allclose(out, [-1.0, 0.0, 1.0])
    out = preprocess_input(np.array([[0, 255]], "uint8"))
    assert out.dtype == np.float32 and out.tolist() == [list(input_range())]  # the range the exports declare


def test_the_declared_range_is_what_preprocessing_spans():
    config = ViTConfig(input_mean=(0.485, 0.456, 0.406), input_std=(0.229, 0.224, 0.225))
    spanned = preprocess_input(np.array([[0, 0, 0], [255, 255, 255]], "float32"), config=config)
    np.testing.assert_allclose(input_range(config.input_mean, config.input_std), (spanned.min(), spanned.max()),
                               rtol=1e-6)


def test_tensors_stay_tensors():
    out = preprocess_input(tf.constant([0, 255], tf.uint8))
    assert isinstance(out, tf.Tensor) and out.numpy().tolist() == [-1.0, 1.0]


def test_resize_and_center_crop_keeps_the_centre_of_the_short_side():
    from keras_vit import resize_and_center_crop

    # Columns numbered 0..39 on a 20x40 image; a 0.5 crop to 10x10 scales the short side to 20 and keeps
    # the middle 10 columns (15..24) and rows.
    image = np.tile(np.arange(40, dtype="float32")[None, :, None], (20, 1, 1))
    cropped = np.asarray(resize_and_center_crop(image, (10, 10), crop_fraction=0.5))
    assert cropped.shape == (10, 10, 1)
    np.testing.assert_allclose(cropped[0, :, 0], np.arange(15, 25))
    whole = np.asarray(resize_and_center_crop(image, (10, 20)))
    assert whole.shape == (10, 20, 1) and whole.min() >= 0 and whole.max() <= 39


@pytest.mark.parametrize("shape, size, crop_fraction, method", [
    ((37, 53, 3), (24, 24), 1.0, "bilinear"), ((300, 200, 3), (32, 48), 0.875, "bilinear"),
    ((300, 200, 3), (32, 48), 0.875, "bicubic"), ((17, 120, 1), (40, 24), 0.875, "bicubic"),
    ((9, 11, 3), (30, 30), 1.0, "bicubic"),  # upsampling: taps past the edges renormalised
])
def test_the_keras_ops_resize_gives_tensorflows_pixels(shape, size, crop_fraction, method):
    # What JAX and PyTorch run (tests/backends/ runs it there), here on TensorFlow's ops: its sizes, crop and kernel.
    from keras_vit.preprocessing import _resize_and_center_crop_keras, resize_and_center_crop

    image = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)
    expected = np.asarray(resize_and_center_crop(image, size, crop_fraction, method))
    got = np.asarray(_resize_and_center_crop_keras(image, size, crop_fraction, method))
    assert got.shape == expected.shape == size + shape[-1:]
    np.testing.assert_allclose(got, expected, rtol=0, atol=0.01)


def test_resized_pixels_are_whole_values_in_0_255_whatever_the_filter():
    from keras_vit.preprocessing import resize_pixels

    # A sharp 0/255 edge: bicubic and lanczos overshoot both ways before the clip; the means cannot.
    edge = np.zeros((8, 8, 1), "uint8")
    edge[:, 4:] = 255
    overshoots = []
    for method in ("bilinear", "area", "nearest", "bicubic", "lanczos3"):
        pixels = np.asarray(resize_pixels(edge, (20, 20), interpolation=method))
        assert pixels.min() >= 0 and pixels.max() <= 255 and np.all(pixels == np.round(pixels)), method
        raw = np.asarray(tf.image.resize(edge, (20, 20), method=method))
        overshoots.append(raw.min() < -0.5 or raw.max() > 255.5)
    assert overshoots == [False, False, False, True, True]


def test_per_channel_scaling_takes_the_channels_where_they_are():
    config = ViTConfig(input_mean=(0.485, 0.456, 0.406), input_std=(0.229, 0.224, 0.225))
    pixels = np.random.default_rng(0).integers(0, 256, (2, 4, 5, 3)).astype("uint8")
    last = preprocess_input(pixels, config=config)
    first = preprocess_input(pixels.transpose(0, 3, 1, 2), data_format="channels_first", config=config)
    np.testing.assert_allclose(first, last.transpose(0, 3, 1, 2), rtol=1e-6)  # was scaled as if channels last
    # A grey or RGBA image against a mean of three: refused, not broadcast into three channels.
    for shape in ((4, 5, 1), (4, 5, 4)):
        with pytest.raises(ValueError, match=re.escape(f"per channel (3); received images of shape {shape}")):
            preprocess_input(np.zeros(shape, "uint8"), config=config)
    with pytest.raises(ValueError, match="received 'nhwc'"):
        preprocess_input(pixels, data_format="nhwc")



def test_native_image_size_is_the_built_size_also_for_a_model_of_any_size():
    fields = dict(patch_size=4, hidden_size=16, mlp_dim=32, num_heads=2, num_layers=1, image_size=(8, 12), classes=3)
    assert native_image_size(keras_vit.ViT(**fields)) == (8, 12)
    dynamic = keras_vit.ViT(**fields, dynamic_image_size=True)
    assert dynamic.input_shape[1:3] == (None, None)
    assert native_image_size(dynamic) == (8, 12)
    hybrid = keras_vit.ViT(**{**fields, "patch_size": 1, "image_size": 32}, resnet_num_layers=(1,),
                           dynamic_image_size=True)
    assert native_image_size(hybrid) == (32, 32)  # the grid times the stem's stride


def test_input_config_is_the_model_s_or_the_official_scaling_at_its_size():
    model = keras_vit.ViT(patch_size=4, hidden_size=16, mlp_dim=32, num_heads=2, num_layers=1, image_size=(8, 12),
                          classes=3, input_mean=(0.4, 0.5, 0.6), input_std=(0.2, 0.3, 0.4))
    assert input_config(model) is model.vit_config
    plain = keras.Model(model.inputs, model.outputs)  # a keras.Model of a ViT's layers: no ViTConfig
    config = input_config(plain)
    assert (config.image_size, config.channels) == ((8, 12), 3)
    assert config.input_mean == config.input_std == (0.5, 0.5, 0.5)
