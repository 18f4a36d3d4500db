"""The block options of the later ViT families: each block against its numpy reference, norm_pre's, patch_norm's,
the DINOv2 head's and the projection's places, scanned = unrolled, and defaults that leave the official model as
it was."""

import numpy as np
import pytest

import keras_vit
from keras_vit.layers import EncoderBlock
from keras_vit.layers.scanned_encoder import block_name
from tests import reference
from tests.layer_checks import check_layer, randomize_weights

TINY = dict(patch_size=4, hidden_size=16, mlp_dim=32, num_heads=2, num_layers=2, image_size=8, classes=3,
            classifier_activation=None)
IMAGES = np.random.default_rng(0).uniform(-1, 1, (2, 8, 8, 3)).astype("float32")
OPTIONS = dict(layer_scale_init=0.1, norm_pre=True, patch_bias=False, activation="quick_gelu", qkv_bias="qv")
# The other blocks: AIMv2's (RMSNorm, SwiGLU, patch norm, no qkv bias) with q/k norm.
OPTIONS_2 = dict(norm_layer="rms_norm", qk_norm=True, gated_mlp=True, activation="silu", patch_norm=True,
                 qkv_bias="none", layer_norm_epsilon=1e-5)
OPTION_SETS = pytest.mark.parametrize("options", [OPTIONS, OPTIONS_2], ids=["layer_scale_clip", "aimv2_qk_norm"])


@pytest.mark.parametrize("options, activation", [
    (dict(norm_layer="rms_norm", qkv_bias="qv"), "gelu_tanh"),
    (dict(qk_norm=True), "gelu_tanh"),  # the key's bias counts: normalised with the key
    (dict(qk_norm=True, norm_layer="rms_norm", qkv_bias="none"), "gelu_tanh"),
    (dict(gated_mlp=True, activation="silu", qkv_bias="qv"), "silu"),
    (dict(activation="silu", layer_scale_init=0.5, qkv_bias="qv"), "silu"),
    (dict(gated_mlp=True, activation="gelu", gelu_approximate=False, qkv_bias="qv"), "gelu"),
], ids=["rms_norm", "qk_norm", "qk_rms_norm", "swiglu", "silu", "geglu"])
def test_each_block_option_computes_its_reference(tmp_path, options, activation):
    """The block against the numpy forward pass (tests/reference.py) with weights far from their starts; its
    config, `.keras` round trip and gradients (every weight moves) by check_layer. Without q/k norm a key bias
    gets no gradient (softmax ignores it): those blocks take "qv"."""
    block = EncoderBlock(num_heads=2, mlp_dim=24, layer_norm_epsilon=1e-5, **options)
    tokens = np.random.default_rng(1).normal(size=(2, 5, 16)).astype("float32")
    block(tokens)
    randomize_weights(block)
    outputs = np.asarray(block(tokens))
    weights = reference.block_weights(block)
    if options.get("norm_layer") == "rms_norm":
        assert {"norm_1/scale", "norm_2/scale"} <= set(weights) and "norm_1/beta" not in weights
    if options.get("qk_norm"):
        assert weights["query_norm/" + ("scale" if "norm_layer" in options else "gamma")].shape == (8,)  # head_dim
    if options.get("gated_mlp"):
        assert weights["dense_1/kernel"].shape == (16, 48)  # the gate and the value
    expected = reference.encoder_block(np.float64(tokens), weights, activation=activation,
                                       gated=options.get("gated_mlp", False), eps=1e-5)
    np.testing.assert_allclose(outputs, expected, atol=2e-5)
    # LayerNorm's beta shifts every key alike: no gradient reaches it.
    still = ("encoder_block/attention/key_norm/beta",) if options == dict(qk_norm=True) else ()
    check_layer(block, tmp_path, tokens, still=still)


def test_a_gated_mlp_gates_with_the_first_half():
    """SwiGLU's order (timm's SwiGLUPacked, transformers' DINOv2): the activation takes dense_1's first half."""
    block = EncoderBlock(num_heads=2, mlp_dim=4, gated_mlp=True, activation="silu")
    block.build((None, 3, 8))
    mlp = block.mlp
    kernel = np.zeros((8, 8), "float32")
    kernel[0, :4] = 1.0  # the gate: silu(x0); the value: 2
    mlp.dense_1.kernel.assign(kernel)
    mlp.dense_1.bias.assign(np.r_[np.zeros(4), np.full(4, 2.0)].astype("float32"))
    mlp.dense_2.kernel.assign(np.eye(4, 8, dtype="float32"))
    mlp.dense_2.bias.assign(np.zeros(8, "float32"))
    x = np.zeros((1, 1, 8), "float32")
    x[..., 0] = 1.5
    np.testing.assert_allclose(np.asarray(mlp(x))[0, 0, :4], 2 * reference.silu(1.5), rtol=1e-6)


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


@OPTION_SETS
def test_a_scanned_model_with_every_option_equals_the_unrolled_one(options):
    unrolled = keras_vit.ViT(**TINY, **options)
    randomize_weights(unrolled)
    scanned = keras_vit.ViT(**TINY, **options, scan_layers=True)
    encoder = scanned.get_layer("encoder")
    encoder.load_blocks([unrolled.get_layer(block_name(i)) for i in range(2)])
    by_path = {w.path: w for w in unrolled.weights}
    for weight in scanned.weights:
        if not weight.path.startswith("encoder/"):
            weight.assign(by_path[weight.path].numpy())
    paths = [w.name for w in encoder.weights]
    assert ("layer_scale_2-gamma" in paths) == ("layer_scale_init" in options)
    assert ("attention-query_norm-scale" in paths) == ("qk_norm" in options)
    np.testing.assert_allclose(np.asarray(scanned(IMAGES)), np.asarray(unrolled(IMAGES)), atol=1e-5)


def test_the_defaults_build_the_official_model_weight_for_weight():
    """No new weight, none gone: the official checkpoint keys map one to one as before."""
    model = keras_vit.ViT(**TINY)
    paths = [w.path for w in model.weights]
    assert not [p for p in paths if "layer_scale" in p or "norm_pre" in p or "_norm/scale" in p or "projection" in p]
    assert {"patch_embedding/bias", "encoder_block_0/attention/key_bias"} <= set(paths)
    config = model.vit_config
    assert (config.activation, config.gelu_approximate, config.qkv_bias) == ("gelu", True, "all")
    mlp = model.get_layer(block_name(1)).mlp
    assert (mlp.activation, mlp.gelu_approximate) == ("gelu", True)


@OPTION_SETS
def test_the_last_block_trim_and_the_attention_maps_take_every_option(options):
    """The class-token trim of the last block scales its one token's branches too (behind an RMSNorm
    encoder_norm as a LayerNorm); analysis reads the blocks behind norm_pre, unrolled and scanned."""
    model = keras_vit.ViT(**TINY, **options)
    randomize_weights(model)
    trimmed = keras_vit.trim_last_block(model)
    assert trimmed is not model
    np.testing.assert_allclose(np.asarray(trimmed(IMAGES)), np.asarray(model(IMAGES)), atol=1e-6)
    scanned = keras_vit.ViT(**TINY, **options, scan_layers=True)
    maps = [np.asarray(keras_vit.analysis.attention_maps(m, IMAGES)) for m in (model, scanned)]
    assert maps[0].shape == maps[1].shape == (2, 2, 2, 5, 5)  # per block (batch, heads, tokens, tokens)
    np.testing.assert_allclose(maps[0].sum(-1), 1.0, atol=1e-5)


def test_patch_norm_normalises_each_patch_before_the_positions():
    model = keras_vit.ViT(**TINY, patch_norm=True, norm_layer="rms_norm")
    randomize_weights(model)
    norm = model.get_layer("patch_norm")
    assert norm.input is model.get_layer("patch_embedding").output
    assert model.get_layer("position_embedding").input[0] is norm.output
    probe = keras_vit.ViTModel(model.input, [norm.input, norm.output], vit_config=model.vit_config)
    patches, normalised = (np.asarray(t, np.float64) for t in probe(IMAGES))
    np.testing.assert_allclose(normalised, reference.rms_norm(patches, norm.scale.numpy()), atol=1e-5)


def test_the_dinov2_head_reads_the_class_token_beside_the_mean_of_the_patches():
    """Dinov2ForImageClassification: concat(class token, mean of the patch tokens), both after the final norm;
    register tokens are in neither."""
    model = keras_vit.ViT(**TINY, classifier="token_and_gap", num_register_tokens=2)
    randomize_weights(model)
    assert model.vit_config.class_token and model.get_layer("head").kernel.shape == (32, 3)
    sequence = model.get_layer("encoder_norm").output
    probe = keras_vit.ViTModel(model.input, [sequence, model.get_layer("pooling").output], vit_config=model.vit_config)
    tokens, pooled = (np.asarray(t) for t in probe(IMAGES))
    np.testing.assert_allclose(pooled, np.concatenate([tokens[:, 0], tokens[:, 3:].mean(1)], -1), atol=1e-6)
    assert np.asarray(keras_vit.analysis.attention_maps(model, IMAGES)).shape[-1] == 7  # 1 + 2 registers + 4 patches
    assert keras_vit.trim_last_block(model) is model  # the mean reads every patch token


def test_the_projection_is_the_features_model_output():
    """CLIP's visual_projection: no bias, after the final norm of the pooled vector; what include_top=False gives."""
    features = keras_vit.ViT(**{**TINY, "classes": 0}, projection_dim=6, norm_pre=True, include_top=False)
    randomize_weights(features)
    projection = features.get_layer("projection")
    assert projection.bias is None and features.output_shape == (None, 6)
    pooled = keras_vit.ViTModel(features.input, features.get_layer("pooling").output, vit_config=features.vit_config)
    np.testing.assert_allclose(np.asarray(features(IMAGES)), np.asarray(pooled(IMAGES)) @ projection.kernel.numpy(),
                               atol=1e-5)
    classifier = keras_vit.ViT(**TINY, projection_dim=6)
    assert keras_vit.model.head_input(classifier)[1] == "projection"
