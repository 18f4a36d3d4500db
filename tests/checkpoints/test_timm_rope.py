"""timm's `Eva` class (EVA02, DINOv3, Naver's RoPE-ViT, the SBB RoPE ViTs) read from files timm itself wrote
(tests/fixtures/make_rope_fixtures.py), held to timm's outputs at the file's 32 px and at 48 px, written back as
timm's own tensors, and the table of their builders held to what timm's builders pass."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import keras_vit
from keras_vit import checkpoints
from keras_vit.checkpoints import timm
from keras_vit.checkpoints.safetensors import read_safetensors
from tests.checkpoints.test_timm_families import take_timms_resized_table

ROPE = Path(__file__).parents[1] / "fixtures" / "rope"
CASES = json.loads((ROPE / "cases.json").read_text())["cases"]
# What each file must read as (beyond the sizes).
EXPECTED = {
    "timm_eva02_tiny": dict(rotary_embedding="rope_eva", rope_reference_grid=(16, 16), rope_theta=None,
                            qkv_bias="qv", gated_mlp=True, activation="silu", mlp_norm=False, classifier="gap",
                            fc_norm=True, layer_scale_init=None, mlp_dim=128),
    "timm_eva02_base": dict(rotary_embedding="rope_eva", qkv_bias="qv", gated_mlp=True, mlp_norm=True,
                            attention_norm=False, classifier="gap", fc_norm=True),
    "timm_eva02_clip": dict(rotary_embedding="rope_eva", qkv_bias="qv", mlp_norm=True, attention_norm=True,
                            classifier="token", fc_norm=False, classes=16),
    "timm_dinov3": dict(rotary_embedding="rope_dinov3", qkv_bias="none", num_register_tokens=4, layer_scale_init=1e-5,
                        layer_norm_epsilon=1e-5, classifier="gap", fc_norm=False, dynamic_image_size=True,
                        position_embedding="none", classes=0, gated_mlp=False),
    "timm_dinov3_plus_qkvb": dict(rotary_embedding="rope_dinov3", qkv_bias="qv", gated_mlp=True, activation="silu",
                                  mlp_dim=128, layer_norm_epsilon=1e-5),
    "timm_rope_axial": dict(rotary_embedding="rope_axial", qkv_bias="all", layer_scale_init=1e-5, classifier="token",
                            position_embedding="none", activation="gelu", gelu_approximate=False),
    "timm_rope_mixed": dict(rotary_embedding="rope_mixed", qkv_bias="all", position_embedding="none"),
    "timm_rope_mixed_ape": dict(rotary_embedding="rope_mixed", position_embedding="learned_1d", no_embed_class=True),
    "timm_rope_reg1_gap": dict(rotary_embedding="rope_eva", rope_reference_grid=(16, 16), class_token=False,
                               num_register_tokens=1, qkv_bias="qv", layer_scale_init=1e-5, classifier="gap",
                               fc_norm=True, position_embedding="none"),
}
assert set(EXPECTED) == {case for case in CASES if case.startswith("timm_")}


@pytest.fixture(scope="module")
def models():
    """Each case's model as read (one build per case for the module)."""
    return {case: keras_vit.ViT.from_checkpoint(ROPE / case, classifier_activation=None) for case in EXPECTED}


def _outputs_and_tokens(model, images):
    """The model's outputs and its encoded sequence (timm's forward_features: after the final norm, if any)."""
    sequence = keras_vit.ViTModel(model.input, [model.output, model.get_layer("pooling").input],
                                  vit_config=model.vit_config)
    return (np.asarray(t) for t in sequence(images))


@pytest.mark.parametrize("case", EXPECTED)
def test_a_timm_eva_file_gives_timms_outputs(models, case):
    io = np.load(ROPE / f"{case}_io.npz")
    model = models[case]
    config = model.vit_config
    assert {name: getattr(config, name) for name in EXPECTED[case]} == EXPECTED[case]
    assert config.interpolation == "bicubic" and config.image_size == (32, 32)
    outputs, tokens = _outputs_and_tokens(model, io["inputs"])
    np.testing.assert_allclose(outputs, io["outputs"], atol=1e-5)
    np.testing.assert_allclose(tokens, io["last_hidden_state"], atol=1e-5)


@pytest.mark.parametrize("case", EXPECTED)
def test_a_timm_eva_file_at_48_px_gives_timms_outputs(models, case):
    """timm at img_size=48: the RoPE table rebuilt by its rule, pos_embed resampled (and rounded to the file's
    dtype); DINOv3 (dynamic_img_size) is the same model called at 48 px, as is ours."""
    io = np.load(ROPE / f"{case}_io.npz")
    bigger = keras_vit.ViT.from_checkpoint(ROPE / case, image_size=48, classifier_activation=None)
    assert bigger.vit_config.rope_reference_grid == models[case].vit_config.rope_reference_grid
    if "pos_embed_48" in io:
        take_timms_resized_table(bigger, io, CASES[case]["dtype"])
    outputs, tokens = _outputs_and_tokens(bigger, io["inputs_48"])
    np.testing.assert_allclose(outputs, io["outputs_48"], atol=1e-5)
    np.testing.assert_allclose(tokens, io["last_hidden_state_48"], atol=1e-5)
    if models[case].vit_config.dynamic_image_size:  # the 32 px model itself, called at 48 px
        outputs, tokens = _outputs_and_tokens(models[case], io["inputs_48"])
        np.testing.assert_allclose(outputs, io["outputs_48"], atol=1e-5)
        np.testing.assert_allclose(tokens, io["last_hidden_state_48"], atol=1e-5)


@pytest.mark.parametrize("case", EXPECTED)
def test_written_files_hold_timms_tensors(models, tmp_path, case):
    written = checkpoints.save_timm(models[case], str(tmp_path / "out"))
    theirs = read_safetensors(str(ROPE / case / "model.safetensors"))
    ours = read_safetensors(str(Path(written) / "model.safetensors"))
    assert sorted(ours) == sorted(theirs)
    for name in theirs:  # the fixtures' float16 / bfloat16 values are float32 here, exactly
        np.testing.assert_array_equal(ours[name], np.asarray(theirs[name], np.float32), err_msg=name)
    assert keras_vit.config_from_checkpoint(written) == models[case].vit_config


SMALL = dict(patch_size=8, hidden_size=32, mlp_dim=48, num_heads=2, num_layers=2, image_size=32, classes=3)


@pytest.mark.parametrize("fields", [
    # Each rotary kind with another layout than its fixtures': q/k/v projections apart (mlp_norm), a full bias
    # with the norms, a plain MLP with a sub-LN, a theta of its own, an epsilon of the other builders.
    dict(rotary_embedding="rope_eva", rope_reference_grid=(8, 8), qkv_bias="all", mlp_norm=True, attention_norm=True,
         gated_mlp=True, activation="silu", gelu_approximate=False),
    dict(rotary_embedding="rope_axial", rope_theta=50.0, qkv_bias="qv", mlp_norm=True, gelu_approximate=False,
         layer_scale_init=0.1, classifier="gap", fc_norm=True),
    dict(rotary_embedding="rope_mixed", qkv_bias="none", num_register_tokens=2, no_embed_class=True,
         gelu_approximate=False, layer_norm_epsilon=1e-5),
    dict(rotary_embedding="rope_dinov3", gated_mlp=True, activation="silu", qkv_bias="qv", dynamic_image_size=True,
         position_embedding="none", classifier="gap", layer_norm_epsilon=1e-5, norm_pre=True, patch_bias=False),
])
def test_keras_vit_rotary_models_round_trip(tmp_path, fields):
    model = keras_vit.ViT(**{**SMALL, **fields}, classifier_activation=None)
    for weight in model.weights:
        weight.assign(np.random.default_rng(len(weight.path)).normal(0, 0.3, weight.shape))
    images = np.random.default_rng(0).normal(size=(2, 32, 32, 3)).astype("float32")
    directory = checkpoints.save_timm(model, str(tmp_path / "out"))
    reread = keras_vit.ViT.from_checkpoint(directory, classifier_activation=None)
    assert reread.vit_config == model.vit_config.replace(interpolation="bicubic")
    np.testing.assert_array_equal(np.asarray(reread(images)), np.asarray(model(images)))


def test_rotary_models_timm_cannot_represent_are_refused(tmp_path):
    for fields, message in ((dict(layer_norm_epsilon=1e-4), r"layer_norm_epsilon=0.0001 \(timm's Eva builders"),
                            (dict(classifier="map"), r"classifier='map' \(timm's Eva: 'token' or 'gap'\)"),
                            (dict(norm_layer="rms_norm"), r"norm_layer='rms_norm'"),
                            (dict(activation="quick_gelu"), r"activation='quick_gelu'")):
        with pytest.raises(ValueError, match=r"timm's Eva cannot represent this model: .*" + message):
            checkpoints.save_timm(keras_vit.ViT(**SMALL, rotary_embedding="rope_axial", **fields),
                                  str(tmp_path / "x"))
    # Without rotary positions a model is written as VisionTransformer, which has no place for EVA02's norms.
    with pytest.raises(ValueError, match=r"timm's VisionTransformer cannot represent this model: "
                                         r"attention_norm=True \(timm: False\); mlp_norm=True \(timm: False\)"):
        checkpoints.save_timm(keras_vit.ViT(**SMALL, attention_norm=True, mlp_norm=True), str(tmp_path / "x"))
    assert not (tmp_path / "x").exists()


def _in_our_words(args):
    """timm's recorded builder arguments (architectures.json) in EVA_ARCHITECTURES' words."""
    words = {key: tuple(value) if isinstance(value, list) else value for key, value in args.items()
             if key != "pretrained_cfg"}
    norm = words.pop("norm_layer", None)
    if norm is not None:
        assert norm["layer"] == "LayerNorm"
        words["norm_eps"] = norm["eps"]
    return words


def test_the_eva_table_is_what_timms_builders_pass():
    recorded = json.loads((ROPE / "architectures.json").read_text())
    assert set(timm.EVA_ARCHITECTURES) == set(recorded)
    for name, args in timm.EVA_ARCHITECTURES.items():
        assert args == _in_our_words(recorded[name]), name  # exactly: mlp_ratio 4 * 2 / 3 included
    for case in EXPECTED:  # each fixture's builder is in the table as recorded
        assert _in_our_words(CASES[case]["builder_args"]) == timm.EVA_ARCHITECTURES[CASES[case]["architecture"]]


def _edited(tmp_path, case, **model_args):
    """A copy of `case` whose config.json has `model_args` added (a value None: the key removed)."""
    folder = tmp_path / case
    shutil.copytree(ROPE / case, folder)
    config = json.loads((folder / "config.json").read_text())
    if "architecture" in model_args:
        config["architecture"] = model_args.pop("architecture")
    config["model_args"].update(model_args)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("model_args, message", [
    (dict(rope_grid_indexing="ij"), r"rope_type='cat', rope_grid_indexing='ij', ref_feat_shape=None, "
                                    r"rope_rotate_half=False; keras_vit reads timm's rope_type \['cat', 'mixed', "
                                    r"'dinov3'\]"),
    (dict(rope_type="mrope"), r"rope_type='mrope'"),
    (dict(use_naflex=True), r"use_naflex=True \(vit_small_patch16_rope_224\) is NaFlex"),
    (dict(rope_jitter_coords=1.5), r"rope_jitter_coords=1.5 .* is a RoPE augmentation"),
    (dict(rope_grid_offset=0.5), r"rope_grid_offset=0.5"),
    (dict(architecture="eva02_enormous_patch14_clip_224"), r"use_post_norm=True \(eva02_enormous_patch14_clip_224\) "
                                                           r"is a post-norm block"),
    (dict(architecture="eva_giant_patch14_224"), r"architecture 'eva_giant_patch14_224' is not a timm ViT keras_vit "
                                                 r"reads"),
])
def test_what_keras_vit_cannot_represent_is_refused_by_name(tmp_path, model_args, message):
    with pytest.raises(ValueError, match=message):
        keras_vit.config_from_checkpoint(_edited(tmp_path, "timm_rope_axial", **model_args))


def test_a_bare_eva_file_asks_for_its_config(tmp_path):
    """Without config.json the RoPE kind (in the architecture's name only) cannot be known: refused, not guessed."""
    bare = tmp_path / "eva02.safetensors"
    shutil.copy(ROPE / "timm_eva02_tiny" / "model.safetensors", bare)
    with pytest.raises(ValueError, match=rf"{bare} holds timm Eva weights .*expected config.json beside the file"):
        keras_vit.config_from_checkpoint(bare)
