import re

import numpy as np
import pytest
import tensorflow as tf

from keras_vit import preprocess_input
from keras_vit import ViTConfig
from keras_vit.preprocessing import input_range


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

