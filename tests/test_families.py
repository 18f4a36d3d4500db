"""The family builders (DINOv2, DeiT III, CLIP, EVA02, DINOv3): their configurations are what keras_vit's timm
reader makes of the architectures their weights come from, they load those files as timm computes them, and their
named weights resolve through the offline-first hub cache."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import keras_vit
from keras_vit import families
from keras_vit.checkpoints import timm

ROOT = Path(__file__).parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "families"
ROPE = ROOT / "tests" / "fixtures" / "rope"
# The builder fields a tiny fixture of the family changes: its sizes.
TINY = dict(patch_size=8, hidden_size=32, num_heads=2, image_size=32)


def _architecture(family):
    """timm's architecture name of a family size: the hub id's name before its tag."""
    return next(iter(families.WEIGHTS[family].values())).hub_id.split("/")[1].split(".")[0]


def _architectures(family):
    """timm's architecture of each of the family size's released weights, with the file's resolution."""
    return {(w.hub_id.split("/")[1].split(".")[0], w.image_size) for w in families.WEIGHTS[family].values()}


VIT_FAMILIES = sorted(f for f in families.FAMILIES if _architecture(f) in timm.FAMILY_ARCHITECTURES)
EVA_FAMILIES = sorted(f for f in families.FAMILIES if _architecture(f) in timm.EVA_ARCHITECTURES)


def test_every_family_is_a_timm_architecture_the_reader_reads():
    assert sorted(VIT_FAMILIES + EVA_FAMILIES) == sorted(families.FAMILIES)
    assert {f.split("-")[0] for f in EVA_FAMILIES} == {"EVA02", "DINOv3"}


@pytest.mark.parametrize("family", VIT_FAMILIES)
def test_each_family_is_what_the_timm_reader_makes_of_its_architecture(family):
    config, name = families.FAMILIES[family], _architecture(family)
    args = timm.FAMILY_ARCHITECTURES[name]
    hidden = int(args["embed_dim"] * args.get("mlp_ratio", 4.0))
    assert (config.hidden_size, config.num_layers, config.num_heads, config.patch_size) == (
        args["embed_dim"], args["depth"], args["num_heads"], (args["patch_size"],) * 2)
    assert config.mlp_dim == (hidden // 2 if args.get("mlp_layer") == "swiglu_packed" else hidden)
    read = {**timm._block_fields(args, name), **timm._activation(args.get("act_layer"), name)}
    assert {field: getattr(config, field) for field in read} == read
    assert (config.no_embed_class, config.num_register_tokens) == (args.get("no_embed_class", False),
                                                                   args.get("reg_tokens", 0))
    assert (config.interpolation, config.gelu_approximate) == ("bicubic", False)


@pytest.mark.parametrize("family", EVA_FAMILIES)
def test_each_eva_family_is_what_the_timm_reader_makes_of_each_of_its_architectures(family):
    """EVA02 and DINOv3 (timm's Eva class): every released file's architecture (EVA02's at 224 and at its
    fine-tuned resolution) gives the builder's fields, rotary positions included; the resolution is the file's."""
    config = families.FAMILIES[family]
    for name, image_size in _architectures(family):
        args = timm.EVA_ARCHITECTURES[name]
        read = {**timm._eva_fields(args, name), **timm._training_fields(args)}
        del read["drop_path_rate"], read["dropout_rate"], read["attention_dropout_rate"]
        assert {field: getattr(config, field) for field in read} == read, name
        assert (config.hidden_size, config.num_layers, config.num_heads, config.patch_size) == (
            args["embed_dim"], args["depth"], args["num_heads"], (args["patch_size"],) * 2)
        assert (config.class_token, config.num_register_tokens, config.no_embed_class) == (
            args.get("class_token", True), args.get("num_reg_tokens", 0), args.get("no_embed_class", False))
        assert config.classifier == timm._POOLS[args.get("global_pool", "avg")]
        assert config.position_embedding == ("learned_1d" if args.get("use_abs_pos_emb", True) else "none")
        assert (image_size or config.image_size[0],) * 2 == (args.get("img_size", 224) if not args.get(
            "dynamic_img_size") else 256,) * 2  # DINOv3's: timm's pretrained input_size, any size computing
        assert (config.interpolation, config.gelu_approximate) == ("bicubic", False)


_EVA02_TINY = dict(hidden_size=48, num_heads=3, mlp_dim=128, num_layers=2, classes=10)


@pytest.mark.parametrize("builder, fixture, sizes", [
    ("DINOv2_S14", FIXTURES / "timm_dinov2", dict(mlp_dim=64, num_layers=2)),
    ("DINOv2_G14", FIXTURES / "timm_dinov2_swiglu", dict(hidden_size=48, mlp_dim=128, num_layers=1)),
    ("DeiT3_S16", FIXTURES / "timm_deit3", dict(mlp_dim=64, num_layers=1, classes=10)),
    ("CLIP_B16", FIXTURES / "timm_clip", dict(mlp_dim=64, num_layers=2, classes=24)),
    ("EVA02_Ti14", ROPE / "timm_eva02_tiny", _EVA02_TINY),
    ("EVA02_B14", ROPE / "timm_eva02_base", _EVA02_TINY),
    ("DINOv3_S16", ROPE / "timm_dinov3", dict(mlp_dim=128, num_layers=2)),
])
def test_a_builder_loads_its_familys_file_as_timm_computes_it(builder, fixture, sizes):
    """The builder's conventions (epsilon, mean and std, LayerScale, resizing, rotary positions) are the file's: the
    load is not refused as another function, and gives timm's outputs."""
    model = getattr(keras_vit, builder)(weights=fixture, **{**TINY, **sizes}, classifier_activation=None)
    mean = json.loads((fixture / "config.json").read_text())["pretrained_cfg"]["mean"]
    assert model.vit_config.input_mean == pytest.approx(mean)
    io = np.load(f"{fixture}_io.npz")
    np.testing.assert_allclose(np.asarray(model(io["inputs"])), io["outputs"], atol=1e-5)


NAMED = """
import sys, numpy as np, keras_vit
from keras_vit.checkpoints import WeightsUnavailable
model = keras_vit.DINOv2_S14(weights="lvd142m", patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2,
                             num_layers=2, image_size=32)
with np.load(sys.argv[1]) as io:
    print("max-diff", float(np.abs(np.asarray(model(io["inputs"])) - io["outputs"]).max()))
tiny = dict(patch_size=8, hidden_size=48, mlp_dim=128, num_heads=3, num_layers=2)
eva = keras_vit.EVA02_Ti14(weights="mim_in22k", **tiny)  # the file's 224 px, no head: the MIM weights' own
print("eva", eva.vit_config.image_size, eva.output_shape)
eva = keras_vit.EVA02_Ti14(weights="mim_in22k", image_size=32, **tiny)
with np.load(sys.argv[2]) as io:
    print("eva-diff", float(np.abs(np.asarray(eva(io["inputs"])) - io["pre_logits"]).max()))
try:
    keras_vit.DeiT3_S16(weights="fb_in1k")
except WeightsUnavailable as error:
    print("unavailable", str(error).splitlines()[0])
"""


def test_named_weights_resolve_through_the_offline_hub_cache(tmp_path):
    """`weights="lvd142m"` is timm's hub repository, read from the cache (a fixture put there under that id);
    EVA02's MIM weights build the model at their 224 px without a head; offline, an uncached one names its
    repository."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    for fixture, name in ((FIXTURES / "timm_dinov2", "vit_small_patch14_dinov2.lvd142m"),
                          (ROPE / "timm_eva02_tiny", "eva02_tiny_patch14_224.mim_in22k")):
        repo = tmp_path / "cache" / f"models--timm--{name}"
        shutil.copytree(fixture, repo / "snapshots" / commit)
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(commit)
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT),
           "TF_CPP_MIN_LOG_LEVEL": "3"}
    io = (FIXTURES / "timm_dinov2_io.npz", ROPE / "timm_eva02_tiny_io.npz")
    done = subprocess.run([sys.executable, "-c", NAMED, *io], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert float(done.stdout.split("max-diff")[1].split()[0]) < 1e-5
    assert "eva (224, 224) (None, 48)" in done.stdout
    assert float(done.stdout.split("eva-diff")[1].split()[0]) < 1e-5
    assert "the Hugging Face hub id 'timm/deit3_small_patch16_224.fb_in1k'" in done.stdout


def test_a_tag_of_another_builder_and_a_missing_variant_are_refused():
    with pytest.raises(ValueError, match=r"DeiT3_S16 has the released weights \['fb_in1k', 'fb_in22k_ft_in1k'\]"):
        keras_vit.DeiT3_S16(weights="lvd142m")
    with pytest.raises(ValueError, match=r"CLIP_B16 has no register variant to choose; received registers=True"):
        keras_vit.CLIP_B16(registers=True)
    with pytest.raises(ValueError, match=r"DINOv3_B16 has no register variant to choose \(its 4 register tokens are "
                                         r"always there\)"):
        keras_vit.DINOv3_B16(registers=True)
    with pytest.raises(ValueError, match=r"DINOv3_S16Plus has the released weights \['lvd1689m'\]"):
        keras_vit.DINOv3_S16Plus(weights="lvd142m")


def test_pretrained_md_lists_the_family_weights():
    docs = (ROOT / "docs" / "PRETRAINED.md").read_text()
    assert families.markdown_table() in docs
