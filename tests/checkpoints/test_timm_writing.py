"""keras_vit models written in timm's Hugging Face layout (`keras_vit.checkpoints.save_timm`).

Reading a timm fixture and writing it again gives timm's own tensors back; a
keras_vit model round-trips. timm itself loads such directories with the same
logits (`make_timm_extra_fixtures.py --verify DIR`, outside the suite).
"""

import json
import os

import numpy as np
import pytest

import keras_vit
from keras_vit import checkpoints
from keras_vit.checkpoints.safetensors import read_safetensors

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures")
SMALL = dict(patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2, image_size=32)


@pytest.mark.parametrize("case", ["timm/augreg", "timm/deit_distilled", "timm/gap_fc_norm", "timm_extra/map_reg",
                                  "timm_extra/reg4_gap", "timm_extra/reg2_token", "families/timm_dinov2",
                                  "families/timm_dinov2_reg4", "families/timm_dinov2_swiglu", "families/timm_deit3",
                                  "families/timm_clip_quickgelu", "families/timm_aimv2", "families/timm_qk_norm",
                                  "families/timm_rmsnorm"])
def test_written_files_hold_timms_tensors(tmp_path, case):
    source = os.path.join(FIXTURES, case)
    model = keras_vit.ViT.from_checkpoint(source)
    written = checkpoints.save_timm(model, str(tmp_path / "out"))
    theirs = read_safetensors(os.path.join(source, "model.safetensors"))
    ours = read_safetensors(os.path.join(written, "model.safetensors"))
    assert sorted(ours) == sorted(theirs)
    for name in theirs:  # the fixtures' float16 / bfloat16 values are float32 here, exactly
        np.testing.assert_array_equal(ours[name], np.asarray(theirs[name], np.float32), err_msg=name)
    assert keras_vit.config_from_checkpoint(written) == model.vit_config


@pytest.mark.parametrize("fields", [
    dict(image_size=(32, 48), classes=3),
    dict(distilled=True, classes=4, gelu_approximate=False),
    dict(classifier="map", num_register_tokens=2, class_token=True, no_embed_class=True, classes=5),
    dict(classifier="gap", fc_norm=True, classes=0),
    # The later families' blocks, each with the timm architecture whose layers compute it.
    dict(layer_scale_init=0.1, qk_norm=True, qkv_bias="none", activation="quick_gelu", classes=3),
    dict(norm_layer="rms_norm", norm_pre=True, patch_bias=False, gelu_approximate=True, classes=3),
    dict(layer_norm_epsilon=1e-5, norm_pre=True, patch_bias=False, classes=24),
    dict(gated_mlp=True, activation="silu", mlp_dim=40, hidden_size=48, num_heads=2, layer_scale_init=1e-5,
         classes=0),
    dict(norm_layer="rms_norm", layer_norm_epsilon=1e-5, patch_norm=True, gated_mlp=True, activation="silu",
         qkv_bias="none", classifier="gap", class_token=False, classes=0),
])
def test_keras_vit_models_round_trip(tmp_path, fields):
    model = keras_vit.ViT(**{**SMALL, **fields}, classifier_activation=None)
    for weight in model.weights:
        weight.assign(np.random.default_rng(len(weight.path)).normal(0, 0.3, weight.shape))
    images = np.random.default_rng(0).normal(size=(2, *model.vit_config.image_size, 3)).astype("float32")
    directory = checkpoints.save_timm(model, str(tmp_path / "out"))
    with open(os.path.join(directory, "config.json")) as f:
        args = json.load(f)["model_args"]
    assert args["act_layer" if model.vit_config.gelu_approximate else "embed_dim"]  # tanh GELU said, or not
    reread = keras_vit.ViT.from_checkpoint(directory, classifier_activation=None)
    # timm resizes positions bicubic: the one field the file does not carry from keras_vit.
    assert reread.vit_config == model.vit_config.replace(interpolation="bicubic")
    np.testing.assert_array_equal(np.asarray(reread(images)), np.asarray(model(images)))


def test_models_timm_cannot_represent_are_refused(tmp_path):
    for fields, message in ((dict(representation_size=16), r"representation_size=16"),
                            (dict(position_embedding="learned_2d"), r"position_embedding='learned_2d'"),
                            (dict(layer_norm_epsilon=1e-4), r"layer_norm_epsilon=0.0001"),
                            # Written anyway, they read back as another function, or not at all.
                            (dict(qkv_bias="qv"), r"qkv_bias='qv' \(timm's VisionTransformer: 'all' or 'none'\)"),
                            (dict(patch_bias=False), r"norm_pre=False with patch_bias=False"),
                            (dict(patch_norm=True), r"patch_norm=True"),
                            (dict(projection_dim=4), r"projection_dim=4"),
                            (dict(classifier="token_and_gap"), r"classifier='token_and_gap'")):
        with pytest.raises(ValueError, match=r"timm's VisionTransformer cannot represent this model: .*" + message):
            checkpoints.save_timm(keras_vit.ViT(**SMALL, **fields), str(tmp_path / "x"))
    assert not os.path.exists(tmp_path / "x")


def test_writing_refuses_a_non_empty_directory_and_non_finite_weights(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "model-00001-of-00002.safetensors").write_bytes(b"another model's shard")
    with pytest.raises(ValueError, match=r"A timm model directory is written into a new or empty directory; "
                                         r".*other holds \[.model-00001-of-00002\.safetensors.\]\. Nothing was"):
        checkpoints.save_timm(keras_vit.ViT(**SMALL, classes=3), str(other))
    assert os.listdir(other) == ["model-00001-of-00002.safetensors"]
    model = keras_vit.ViT(**SMALL, classes=3)
    model.weights[-1].assign(np.full(model.weights[-1].shape, np.inf))
    with pytest.raises(ValueError, match=r"NaN or infinite values .* nothing was written to .*inf"):
        checkpoints.save_timm(model, str(tmp_path / "inf"))
    assert not os.path.exists(tmp_path / "inf")
