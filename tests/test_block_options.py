"""The block options of the later ViT families as a whole model: norm_pre's place, scanned = unrolled, and
defaults that leave the official model as it was."""

import numpy as np

import keras_vit
from keras_vit.layers.scanned_encoder import block_name
from tests import reference
from tests.layer_checks import randomize_weights

TINY = dict(patch_size=4, hidden_size=16, mlp_dim=32, num_heads=2, num_layers=2, image_size=8, classes=3,
            classifier_activation=None)
IMAGES = np.random.default_rng(0).uniform(-1, 1, (2, 8, 8, 3)).astype("float32")
OPTIONS = dict(layer_scale_init=0.1, norm_pre=True, patch_bias=False, activation="quick_gelu", qkv_bias="qv")


def test_norm_pre_normalises_the_sequence_the_first_block_reads():
    """timm's norm_pre / CLIP's ln_pre: after the positions (and their dropout), before the blocks, at the
    config's epsilon."""
    model = keras_vit.ViT(**TINY, norm_pre=True, layer_norm_epsilon=1e-5)
    randomize_weights(model)
    norm = model.get_layer("norm_pre")
    assert norm.epsilon == 1e-5 and norm.input is model.get_layer("embedding_dropout").output
    assert model.get_layer(block_name(0)).input is norm.output
    probe = keras_vit.ViTModel(model.input, [norm.input, norm.output], vit_config=model.vit_config)
    tokens, normalised = (np.asarray(t, np.float64) for t in probe(IMAGES))
    np.testing.assert_allclose(normalised, reference.layer_norm(tokens, norm.gamma.numpy(), norm.beta.numpy(), 1e-5),
                               atol=1e-5)


def test_a_scanned_model_with_every_option_equals_the_unrolled_one():
    unrolled = keras_vit.ViT(**TINY, **OPTIONS)
    randomize_weights(unrolled)
    scanned = keras_vit.ViT(**TINY, **OPTIONS, scan_layers=True)
    encoder = scanned.get_layer("encoder")
    encoder.load_blocks([unrolled.get_layer(block_name(i)) for i in range(2)])
    by_path = {w.path: w for w in unrolled.weights}
    for weight in scanned.weights:
        if not weight.path.startswith("encoder/"):
            weight.assign(by_path[weight.path].numpy())
    gammas = [unrolled.get_layer(block_name(i)).layer_scales[1].gamma.numpy() for i in range(2)]
    np.testing.assert_array_equal(next(w for w in encoder.weights if w.name == "layer_scale_2-gamma").numpy(),
                                  np.stack(gammas))
    np.testing.assert_allclose(np.asarray(scanned(IMAGES)), np.asarray(unrolled(IMAGES)), atol=1e-5)


def test_the_defaults_build_the_official_model_weight_for_weight():
    """No new weight, none gone: the official checkpoint keys map one to one as before."""
    model = keras_vit.ViT(**TINY)
    paths = [w.path for w in model.weights]
    assert not [p for p in paths if "layer_scale" in p or "norm_pre" in p]
    assert {"patch_embedding/bias", "encoder_block_0/attention/key_bias"} <= set(paths)
    config = model.vit_config
    assert (config.activation, config.gelu_approximate, config.qkv_bias) == ("gelu", True, "all")
    mlp = model.get_layer(block_name(1)).mlp
    assert (mlp.activation, mlp.gelu_approximate) == ("gelu", True)


def test_the_last_block_trim_and_the_attention_maps_take_every_option():
    """The class-token trim of the last block scales its one token's branches too; analysis reads the blocks
    behind norm_pre, unrolled and scanned."""
    model = keras_vit.ViT(**TINY, **OPTIONS)
    randomize_weights(model)
    np.testing.assert_allclose(np.asarray(keras_vit.trim_last_block(model)(IMAGES)), np.asarray(model(IMAGES)),
                               atol=1e-6)
    scanned = keras_vit.ViT(**TINY, **OPTIONS, scan_layers=True)
    maps = [np.asarray(keras_vit.analysis.attention_maps(m, IMAGES)) for m in (model, scanned)]
    assert maps[0].shape == maps[1].shape == (2, 2, 2, 5, 5)  # per block (batch, heads, tokens, tokens)
    np.testing.assert_allclose(maps[0].sum(-1), 1.0, atol=1e-5)
