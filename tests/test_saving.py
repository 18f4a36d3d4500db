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


# The block options of issue 50 (LayerScale, norm_pre, no patch bias, QuickGELU, q/v bias; RMSNorm, q/k norm,
# SwiGLU, patch norm, DINOv2's head, a projection).
BLOCK_OPTIONS = dict(layer_scale_init=0.1, norm_pre=True, patch_bias=False, activation="quick_gelu", qkv_bias="qv")
BLOCK_OPTIONS_2 = dict(norm_layer="rms_norm", qk_norm=True, gated_mlp=True, activation="silu", patch_norm=True,
                       classifier="token_and_gap", projection_dim=5, layer_scale_init=0.1)


@pytest.mark.parametrize("scan_layers, options", [(False, BLOCK_OPTIONS), (True, BLOCK_OPTIONS),
                                                  (False, BLOCK_OPTIONS_2), (True, BLOCK_OPTIONS_2)])
def test_a_keras_file_with_every_block_option_loads_bit_for_bit(tmp_path, scan_layers, options):
    model = keras_vit.ViT(**TINY, **options, scan_layers=scan_layers)
    randomize_weights(model)
    model.save(tmp_path / "m.keras")
    loaded = keras_vit.load_model(tmp_path / "m.keras")
    assert loaded.vit_config == model.vit_config and loaded.vit_config.layer_scale_init == 0.1
    assert [w.path for w in loaded.weights] == [w.path for w in model.weights]
    for saved, read in zip(model.weights, loaded.weights, strict=True):
        np.testing.assert_array_equal(read.numpy(), saved.numpy())
    np.testing.assert_array_equal(np.asarray(loaded(IMAGES)), np.asarray(model(IMAGES)))


@pytest.mark.parametrize("options", [BLOCK_OPTIONS, BLOCK_OPTIONS_2], ids=["layer_scale_clip", "aimv2_dinov2"])
def test_an_npz_holds_every_block_option_under_extension_keys(tmp_path, options):
    """LayerScale, norm_pre, RMSNorm, q/k and patch norms and the projection are keras_vit extension keys beside
    the file's ViTConfig; an official file (without them) loaded into such a model names what it lacks."""
    model = keras_vit.ViT(**TINY, **options, classifier_activation=None)
    randomize_weights(model)
    path = keras_vit.save_npz(model, tmp_path / "m.npz")
    keys = set(np.load(path).files)
    if "layer_scale_init" in options:
        assert "Transformer/encoderblock_0/LayerScale_2/scale" in keys
    if options.get("norm_layer") == "rms_norm":  # Flax's RMSNorm `scale`, no bias
        assert "Transformer/encoder_norm/scale" in keys and "Transformer/encoder_norm/bias" not in keys
        assert "Transformer/encoderblock_0/MultiHeadDotProductAttention_1/key_norm/scale" in keys
    loaded = keras_vit.load_model(path, classifier_activation=None)
    assert loaded.vit_config == model.vit_config
    np.testing.assert_allclose(np.asarray(loaded(IMAGES)), np.asarray(model(IMAGES)), atol=1e-6)
    official = keras_vit.save_npz(keras_vit.ViT(**TINY), tmp_path / "official.npz")
    with pytest.raises(ValueError, match=r"Missing keys: \[.*(LayerScale_1|embedding_norm)/scale"):
        keras_vit.ViT(**TINY, **options, weights=official)


@pytest.mark.parametrize("swiglu", [False, True])
def test_an_npz_holds_the_options_without_weights_in_its_stored_config(tmp_path, swiglu):
    """No patch bias, q/v bias, QuickGELU, SwiGLU and DINOv2's head leave weights out or change their shapes only:
    the file's ViTConfig says them."""
    options = {key: BLOCK_OPTIONS[key] for key in ("patch_bias", "activation", "qkv_bias")}
    if swiglu:
        options.update(gated_mlp=True, activation="silu", classifier="token_and_gap")
    model = keras_vit.ViT(**TINY, **options, classifier_activation=None)
    randomize_weights(model)
    path = keras_vit.save_npz(model, tmp_path / "m.npz")
    loaded = keras_vit.load_model(path, classifier_activation=None)
    assert loaded.vit_config == model.vit_config
    np.testing.assert_allclose(np.asarray(loaded(IMAGES)), np.asarray(model(IMAGES)), atol=1e-6)
