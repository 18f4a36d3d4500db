"""`save_transformers` of DINOv2, CLIP and SigLIP models: transformers' own tensors back, and refusals by name.

Each `tests/fixtures/families/hf_*` directory (written by transformers 5.24
itself) read and written back holds transformers' tensors bit for bit; a
random keras_vit model of each family reads back to the same model. That
transformers loads what is written with the same outputs is checked with
transformers itself, outside the suite: `tests/fixtures/make_hf_fixtures.py
--verify DIR` (7 fixtures and 9 random models: 1.7e-6 at most).
"""

import json
import os
import types

import numpy as np
import pytest

import keras_vit
from keras_vit import checkpoints
from keras_vit.checkpoints import hf_transformers
from keras_vit.checkpoints.safetensors import read_safetensors

FAMILIES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "families")
# case: the fixture's output in its io file
CASES = {"hf_dinov2": "pooler_output", "hf_dinov2_classifier": "logits", "hf_dinov2_swiglu": "pooler_output",
         "hf_dinov2_registers": "pooler_output", "hf_clip_vision": "pooler_output",
         "hf_clip_projection": "image_embeds", "hf_siglip_vision": "pooler_output"}
# config.json fields from_pretrained builds the model from (the rest are transformers' bookkeeping).
CONFIG_FIELDS = ("architectures", "model_type", "hidden_act", "layer_norm_eps", "image_size", "patch_size",
                 "num_channels", "hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers",
                 "id2label", "mlp_ratio", "use_swiglu_ffn", "qkv_bias", "layerscale_value", "use_mask_token",
                 "num_register_tokens", "projection_dim", "vision_use_head")
PROCESSOR_FIELDS = ("image_processor_type", "image_mean", "image_std", "size", "crop_size", "resample",
                    "rescale_factor")


def _json(directory, name):
    with open(os.path.join(directory, name), encoding="utf-8") as f:
        return json.load(f)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_family_fixture_written_back_is_what_transformers_wrote(tmp_path, case):
    source = os.path.join(FAMILIES, case)
    model = keras_vit.ViT.from_checkpoint(source, classifier_activation=None)
    written = checkpoints.save_transformers(model, str(tmp_path / case), labels=hf_transformers.labels(source))
    theirs = read_safetensors(os.path.join(source, "model.safetensors"))
    ours = read_safetensors(os.path.join(written, "model.safetensors"))
    assert sorted(ours) == sorted(theirs)
    prefix = "dinov2." if case == "hf_dinov2_classifier" else ""
    unheld = {prefix + "embeddings.mask_token"}  # masked-image modelling's token: written as transformers makes it
    if case == "hf_dinov2_registers":
        # The reader folds the class row into the class token; written back as that token beside a zero row.
        unheld |= {"embeddings.cls_token", "embeddings.position_embeddings"}
        table = ours["embeddings.position_embeddings"]
        np.testing.assert_array_equal(table[:, 1:], theirs["embeddings.position_embeddings"][:, 1:])
        np.testing.assert_array_equal(table[:, 0], 0)
        np.testing.assert_array_equal(ours["embeddings.cls_token"] + table[:, :1],
                                      theirs["embeddings.cls_token"] + theirs["embeddings.position_embeddings"][:, :1])
    for name in theirs:
        assert ours[name].dtype == theirs[name].dtype and ours[name].shape == theirs[name].shape, name
        if name in unheld:
            continue
        np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)
    if prefix + "embeddings.mask_token" in ours:
        np.testing.assert_array_equal(ours[prefix + "embeddings.mask_token"], 0)
    expected, got = _json(source, "config.json"), _json(written, "config.json")
    for key in CONFIG_FIELDS:
        assert got.get(key) == expected.get(key), key
    expected, got = _json(source, "preprocessor_config.json"), _json(written, "preprocessor_config.json")
    for key in PROCESSOR_FIELDS:
        assert got.get(key) == expected.get(key), key
    reread = keras_vit.ViT.from_checkpoint(written, classifier_activation=None)
    assert reread.vit_config == model.vit_config
    with np.load(os.path.join(FAMILIES, f"{case}_io.npz")) as io:
        np.testing.assert_allclose(np.asarray(reread(io["inputs"])), io[CASES[case]], atol=1e-5)


SMALL = dict(patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1, image_size=32, classes=0)
DINO = dict(SMALL, layer_scale_init=1e-5, gelu_approximate=False, layer_norm_epsilon=1e-6,
            interpolation="bicubic_no_antialias", input_mean=(0.485, 0.456, 0.406), input_std=(0.229, 0.224, 0.225))
REGISTERS = dict(DINO, num_register_tokens=2, no_embed_class=True, interpolation="bicubic")
CLIP = dict(SMALL, norm_pre=True, patch_bias=False, fc_norm=True, activation="quick_gelu", layer_norm_epsilon=1e-5,
            interpolation="bicubic_no_antialias")
SIGLIP = dict(SMALL, classifier="map", layer_norm_epsilon=1e-6, interpolation="bicubic_no_antialias")
# name: (the model's fields, the class it is written as)
MODELS = {
    "dinov2": (dict(DINO, qkv_bias="none", gelu_approximate=True), "Dinov2Model"),
    "dinov2_classifier": (dict(DINO, classifier="token_and_gap", classes=3), "Dinov2ForImageClassification"),
    "dinov2_swiglu": (dict(DINO, hidden_size=48, mlp_dim=128, gated_mlp=True, activation="silu"), "Dinov2Model"),
    "registers_classifier": (dict(REGISTERS, classifier="token_and_gap", classes=3),
                             "Dinov2WithRegistersForImageClassification"),
    "clip": (CLIP, "CLIPVisionModel"),
    "clip_projection": (dict(CLIP, projection_dim=24, activation="gelu"), "CLIPVisionModelWithProjection"),
    "siglip": (SIGLIP, "SiglipVisionModel"),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_keras_vit_model_of_each_family_round_trips(tmp_path, name):
    fields, architecture = MODELS[name]
    model = keras_vit.ViT(**fields, classifier_activation=None)
    for weight in model.weights:
        weight.assign(np.random.default_rng(len(weight.path)).normal(0, 0.3, weight.shape))
    directory = checkpoints.save_transformers(model, str(tmp_path / name))
    assert _json(directory, "config.json")["architectures"] == [architecture]
    reread = keras_vit.ViT.from_checkpoint(directory, classifier_activation=None)
    assert reread.vit_config == model.vit_config
    images = np.random.default_rng(0).normal(size=(2, 32, 32, 3)).astype("float32")
    np.testing.assert_allclose(np.asarray(reread(images)), np.asarray(model(images)), atol=1e-6)


def _refused(tmp_path, fields, message, labels=None):
    """save_transformers refuses a model of `fields` naming them; nothing is written. (The check runs on the
    model's ViTConfig before any weight is read, so a stand-in carrying the config is enough.)"""
    model = types.SimpleNamespace(vit_config=keras_vit.ViTConfig(**fields), name="m")
    with pytest.raises(ValueError, match=message):
        checkpoints.save_transformers(model, str(tmp_path / "x"), labels=labels)
    assert not os.path.exists(tmp_path / "x")


@pytest.mark.parametrize("fields, message", [
    (dict(DINO, mlp_dim=80), r"transformers' Dinov2Model \(the class for layer_scale_init=1e-05\) cannot represent "
                             r"this model: mlp_dim=80 \(.*hidden_size \* mlp_ratio units, mlp_ratio an int"),
    (dict(DINO, gated_mlp=True, activation="silu", mlp_dim=60),
     r"mlp_dim=60 \(transformers' dinov2 builds \(int\(hidden_size \* mlp_ratio \* 2 / 3\) \+ 7\) // 8 \* 8"),
    (dict(DINO, gated_mlp=True, mlp_dim=88), r"gated_mlp=True with activation='gelu'"),
    (dict(DINO, classes=3), r"Dinov2ForImageClassification .* classifier='token' with a head .*'token_and_gap'"),
    (dict(SMALL, classifier="token_and_gap"), r"Dinov2Model \(the class for classifier='token_and_gap'\) .* "
                                              r"layer_scale_init=None .* without a head"),
    (dict(DINO, qk_norm=True, qkv_bias="qv"), r"qk_norm=True .* qkv_bias='qv'"),
    (dict(DINO, image_size=(32, 48)), r"image_size=\(32, 48\) \(transformers' dinov2 resizes a square grid"),
    (dict(DINO, num_register_tokens=2), r"Dinov2WithRegistersModel \(the class for num_register_tokens=2\) .* "
                                        r"no_embed_class=False"),
    (dict(DINO, no_embed_class=True), r"Dinov2Model .* no_embed_class=True \(transformers: a position row"),
    (dict(SMALL, num_register_tokens=2, no_embed_class=True), r"layer_scale_init=None \(transformers: LayerScale"),
    (dict(CLIP, patch_bias=True, fc_norm=False, classes=3), r"CLIPVisionModel \(the class for norm_pre=True\) .* "
                                                            r"patch_bias=True .* fc_norm=False .* classes=3"),
    (dict(CLIP, layer_scale_init=1.0, representation_size=16), r"representation_size=16 .* layer_scale_init=1\.0"),
    (dict(SIGLIP, classes=3, fc_norm=True), r"SiglipVisionModel \(the class for classifier='map'\) .* fc_norm=True "
                                            r".* classes=3"),
    (dict(SIGLIP, norm_layer="rms_norm", position_embedding="sincos_2d"),
     r"position_embedding='sincos_2d' .* norm_layer='rms_norm'"),
])
def test_models_the_families_cannot_represent_are_refused_by_name(tmp_path, fields, message):
    _refused(tmp_path, fields, message)


def test_labels_must_name_each_class_of_a_dinov2_classifier(tmp_path):
    _refused(tmp_path, dict(DINO, classifier="token_and_gap", classes=3),
             r"`labels` must name each of the 3 classes; received 2 names", labels=["a", "b"])
