"""keras_vit.trim: the last block cut to the tokens the head reads gives the whole model's outputs."""

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import trim
from keras_vit.layers import EncoderBlock, MultiHeadSelfAttention

TINY = dict(patch_size=4, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2, image_size=16, classes=10)
IMAGES = np.random.default_rng(1).uniform(-1, 1, (3, 16, 16, 3)).astype("float32")


def randomized(model):
    """`model` with every weight drawn at random: the zero-initialised head would make any two models agree."""
    rng = np.random.default_rng(0)
    model.set_weights([rng.normal(0, 0.2, w.shape).astype("float32") for w in model.get_weights()])
    return model


def outputs(model):
    return [keras.ops.convert_to_numpy(x) for x in keras.tree.flatten(model(IMAGES, training=False))]


@pytest.mark.parametrize("fields, tokens", [
    (dict(), 1),
    (dict(distilled=True), 2),  # DeiT: the class and distillation tokens' heads, averaged
    (dict(num_register_tokens=4), 1),
    (dict(include_top=False, pooling="token"), 1),
    (dict(representation_size=16), 1),
])
def test_the_trimmed_copy_gives_the_whole_models_outputs(fields, tokens):
    model = randomized(keras_vit.ViT(**TINY, classifier_activation=None, **fields))
    trimmed = keras_vit.trim_last_block(model)
    assert keras_vit.head_tokens(model) == tokens and trimmed is not model
    assert trimmed.get_layer("encoder_block_1").output.shape == (None, tokens, 32)
    assert model.get_layer("encoder_block_1").output.shape == (None, 17 + tokens - 1 + fields.get(
        "num_register_tokens", 0), 32)  # the model itself keeps every token
    for whole, cut in zip(outputs(model), outputs(trimmed), strict=True):
        assert np.abs(whole).max() > 0.1
        np.testing.assert_allclose(cut, whole, rtol=0, atol=1e-5)
    assert trimmed.vit_config == model.vit_config


@pytest.mark.parametrize("fields", [
    dict(classifier="gap"),
    dict(classifier="map"),
    dict(include_top=False, pooling="avg"),
    dict(position_embedding="relative"),
    dict(scan_layers=True),
])
def test_a_head_that_reads_every_token_is_left_whole(fields):
    model = keras_vit.ViT(**TINY, **fields)
    assert keras_vit.head_tokens(model) is None and keras_vit.trim_last_block(model) is model


def test_a_half_precision_model_is_left_whole():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = keras_vit.ViT(**TINY)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert keras_vit.head_tokens(model) == 1 and keras_vit.trim_last_block(model) is model


def test_a_model_that_returns_the_sequence_is_left_whole():
    model = keras_vit.ViT(**TINY)
    sequence = keras.Model(model.input, model.get_layer("encoder_norm").output)
    both = keras.Model(model.input, [model.output, model.get_layer("encoder_block_1").output])
    assert trim.head_tokens(sequence) is None and trim.head_tokens(both) is None


def test_the_copy_is_a_snapshot_of_the_weights():
    model = randomized(keras_vit.ViT(**TINY))
    trimmed = keras_vit.trim_last_block(model)
    before = outputs(trimmed)[0]
    model.set_weights([w * 2 for w in model.get_weights()])
    np.testing.assert_array_equal(outputs(trimmed)[0], before)
    assert not np.allclose(outputs(model)[0], before)


def test_a_wrong_copy_is_refused(monkeypatch):
    model = randomized(keras_vit.ViT(**TINY))
    forward = MultiHeadSelfAttention.call

    def shifted(self, inputs, *args, query_tokens=None, **kwargs):
        out = forward(self, inputs, *args, query_tokens=query_tokens, **kwargs)
        return out * 1.5 if query_tokens else out  # not a constant shift, which the LayerNorms after it undo

    monkeypatch.setattr(MultiHeadSelfAttention, "call", shifted)
    with pytest.raises(RuntimeError, match="trimmed copy of 'vit' differs from it by"):
        keras_vit.trim_last_block(model)


def test_output_tokens_round_trips_and_is_checked():
    block = EncoderBlock(num_heads=2, mlp_dim=16, output_tokens=2)
    assert EncoderBlock.from_config(block.get_config()).output_tokens == 2
    x = np.random.default_rng(0).normal(size=(2, 5, 8)).astype("float32")
    whole = EncoderBlock.from_config({**block.get_config(), "output_tokens": None})
    whole.build(x.shape)
    block.build(x.shape)
    block.set_weights([np.random.default_rng(3).normal(0, 0.3, w.shape) for w in whole.get_weights()])
    whole.set_weights(block.get_weights())
    np.testing.assert_allclose(np.asarray(block(x)), np.asarray(whole(x))[:, :2], atol=1e-6)
    with pytest.raises(ValueError, match="output_tokens=0"):
        EncoderBlock(num_heads=2, mlp_dim=16, output_tokens=0)
    with pytest.raises(ValueError, match="output_tokens=1 cannot be used with relative_position='relative'"):
        EncoderBlock(num_heads=2, mlp_dim=16, output_tokens=1, relative_position="relative", grid_size=2)
