"""The later timm families (DINOv2 with registers and SwiGLU, DeiT III, CLIP, AIMv2, q/k norm, RMSNorm) read from
files timm itself wrote (tests/fixtures/make_family_fixtures.py), held to timm's outputs at the file's 32 px and
at 48 px, and the table of their builders held to what timm's builders pass."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import keras_vit
from keras_vit.checkpoints import timm

FAMILIES = Path(__file__).parents[1] / "fixtures" / "families"
CASES = json.loads((FAMILIES / "cases.json").read_text())["cases"]
# What each file must read as (beyond the sizes).
EXPECTED = {
    "timm_dinov2": dict(layer_scale_init=1e-5, classifier="token", classes=0),
    "timm_dinov2_reg4": dict(layer_scale_init=1e-5, num_register_tokens=4, no_embed_class=True),
    "timm_dinov2_swiglu": dict(gated_mlp=True, activation="silu", mlp_dim=128),
    "timm_deit3": dict(layer_scale_init=1e-6, no_embed_class=True, classes=10),
    "timm_clip": dict(norm_pre=True, patch_bias=False, layer_norm_epsilon=1e-5, activation="gelu", classes=24),
    "timm_clip_quickgelu": dict(norm_pre=True, activation="quick_gelu"),
    "timm_aimv2": dict(norm_layer="rms_norm", patch_norm=True, gated_mlp=True, activation="silu", qkv_bias="none",
                       class_token=False, classifier="gap", fc_norm=False, layer_norm_epsilon=1e-5),
    "timm_qk_norm": dict(qk_norm=True, qkv_bias="none", norm_layer="layer_norm"),
    "timm_rmsnorm": dict(norm_layer="rms_norm", qk_norm=False),
}
# How far timm's resized table is from the float32 resize: it rounds it to the file's dtype (half an ulp).
ROUNDING = {"float32": 0.0, "float16": 2.0**-11, "bfloat16": 2.0**-8}


@pytest.mark.parametrize("case", EXPECTED)
def test_a_timm_family_file_gives_timms_outputs(case):
    io = np.load(FAMILIES / f"{case}_io.npz")
    model = keras_vit.ViT.from_checkpoint(FAMILIES / case, classifier_activation=None)
    config = model.vit_config
    assert {name: getattr(config, name) for name in EXPECTED[case]} == EXPECTED[case]
    assert config.interpolation == "bicubic" and config.image_size == (32, 32)
    sequence = keras_vit.ViTModel(model.input, [model.output, model.get_layer("encoder_norm").output],
                                  vit_config=config)
    outputs, tokens = (np.asarray(t) for t in sequence(io["inputs"]))
    np.testing.assert_allclose(outputs, io["outputs"], atol=1e-5)
    np.testing.assert_allclose(tokens, io["last_hidden_state"], atol=1e-5)

    bigger = keras_vit.ViT.from_checkpoint(FAMILIES / case, image_size=48, classifier_activation=None)
    take_timms_resized_table(bigger, io, CASES[case]["dtype"])
    np.testing.assert_allclose(np.asarray(bigger(io["inputs_48"])), io["outputs_48"], atol=1e-5)


def take_timms_resized_table(model, io, dtype):
    """Asserts `model`'s table (made at 48 px) is timm's `pos_embed_48` but for timm's rounding to the file's
    `dtype` (a float32 file: the same outputs too), then gives the model timm's table, so the rest of it can be
    held to timm's outputs."""
    table = model.get_layer("position_embedding").embedding
    theirs = io["pos_embed_48"]
    bound = ROUNDING[dtype] * np.abs(theirs) + 1e-6
    assert np.all(np.abs(table.numpy() - theirs) <= bound)
    if dtype == "float32":  # the same table: the same outputs
        np.testing.assert_allclose(np.asarray(model(io["inputs_48"])), io["outputs_48"], atol=1e-5)
    table.assign(theirs)  # timm's rounded table: the rest of the model computes as timm's


def _in_our_words(args):
    """timm's recorded builder arguments (architectures.json) in FAMILY_ARCHITECTURES' words."""
    words = {"patch_size": 16, **args}  # VisionTransformer's default patch
    norm = words.pop("norm_layer", None)
    if isinstance(norm, dict):
        words["norm_eps"] = norm["eps"]
        if norm["layer"] == "RmsNorm":
            words["norm_layer"] = "rmsnorm"
    if words.pop("embed_norm_layer", None) is not None:
        words["embed_norm"] = True
    mlp = words.pop("mlp_layer", None)
    if mlp is not None:  # GluMlp(SiLU, gate first) is SwiGLUPacked
        words["mlp_layer"] = "swiglu" if mlp == "SwiGLU" else "swiglu_packed"
        assert mlp == "SwiGLU" or mlp == {"layer": "GluMlp", "act_layer": "SiLU", "gate_last": False}
    if "act_layer" in words:
        words["act_layer"] = words["act_layer"].lower()
    return words


def test_the_family_table_is_what_timms_builders_pass():
    recorded = json.loads((FAMILIES / "architectures.json").read_text())
    assert set(timm.FAMILY_ARCHITECTURES) == set(recorded)
    for name, args in timm.FAMILY_ARCHITECTURES.items():
        ours = {key: value for key, value in args.items() if key != "img_size"}
        assert ours == pytest.approx(_in_our_words(recorded[name])), name
        assert args.get("img_size", int(name.rpartition("_")[2]) if "dinov2" not in name else None) == (
            None if "dinov2" in name else int(name.rpartition("_")[2]))


def test_a_bare_family_file_asks_for_its_config(tmp_path):
    """Without config.json, a CLIP's epsilon or an AIMv2's activation cannot be known: refused, not guessed."""
    for case, named in (("timm_dinov2", "LayerScale"), ("timm_clip", "a norm before the blocks"),
                        ("timm_aimv2", "a patch-embedding norm, a gated MLP, RMSNorm, projections without bias")):
        bare = tmp_path / f"{case}.safetensors"
        shutil.copy(FAMILIES / case / "model.safetensors", bare)
        with pytest.raises(ValueError, match=rf"{bare} has {named}.*only timm's config.json states"):
            keras_vit.ViT.from_checkpoint(bare)


def test_a_norm_layer_keras_vit_lacks_is_refused_by_name(tmp_path):
    folder = tmp_path / "batchnorm"
    shutil.copytree(FAMILIES / "timm_rmsnorm", folder)
    config = json.loads((folder / "config.json").read_text())
    config["model_args"]["norm_layer"] = "batchnorm"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"norm_layer='batchnorm'; keras_vit reads timm's norm_layer "
                                         r"\['layernorm', 'rmsnorm'\]"):
        keras_vit.ViT.from_checkpoint(folder)
