"""The family builders (DINOv2, DeiT III, CLIP): their configurations are what keras_vit's timm reader makes of
the architectures their weights come from, they load those files as timm computes them, and their named weights
resolve through the offline-first hub cache."""

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
# The builder fields a tiny fixture of the family changes: its sizes.
TINY = dict(patch_size=8, hidden_size=32, num_heads=2, image_size=32)


def _architecture(family):
    """timm's architecture name of a family size: the hub id's name before its tag."""
    return next(iter(families.WEIGHTS[family].values())).hub_id.split("/")[1].split(".")[0]


@pytest.mark.parametrize("family", sorted(families.FAMILIES))
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


@pytest.mark.parametrize("builder, fixture, sizes", [
    ("DINOv2_S14", "timm_dinov2", dict(mlp_dim=64, num_layers=2)),
    ("DINOv2_G14", "timm_dinov2_swiglu", dict(hidden_size=48, mlp_dim=128, num_layers=1)),
    ("DeiT3_S16", "timm_deit3", dict(mlp_dim=64, num_layers=1, classes=10)),
    ("CLIP_B16", "timm_clip", dict(mlp_dim=64, num_layers=2, classes=24)),
])
def test_a_builder_loads_its_familys_file_as_timm_computes_it(builder, fixture, sizes):
    """The builder's conventions (epsilon, mean and std, LayerScale, resizing) are the file's: the load is not
    refused as another function, and gives timm's outputs."""
    model = getattr(keras_vit, builder)(weights=FIXTURES / fixture, **{**TINY, **sizes}, classifier_activation=None)
    mean = json.loads((FIXTURES / fixture / "config.json").read_text())["pretrained_cfg"]["mean"]
    assert model.vit_config.input_mean == pytest.approx(mean)
    io = np.load(FIXTURES / f"{fixture}_io.npz")
    np.testing.assert_allclose(np.asarray(model(io["inputs"])), io["outputs"], atol=1e-5)


NAMED = """
import sys, numpy as np, keras_vit
from keras_vit.checkpoints import WeightsUnavailable
model = keras_vit.DINOv2_S14(weights="lvd142m", patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2,
                             num_layers=2, image_size=32)
with np.load(sys.argv[1]) as io:
    print("max-diff", float(np.abs(np.asarray(model(io["inputs"])) - io["outputs"]).max()))
try:
    keras_vit.DeiT3_S16(weights="fb_in1k")
except WeightsUnavailable as error:
    print("unavailable", str(error).splitlines()[0])
"""


def test_named_weights_resolve_through_the_offline_hub_cache(tmp_path):
    """`weights="lvd142m"` is timm's hub repository, read from the cache (a fixture put there under that id);
    offline, an uncached one names its repository."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "cache" / "models--timm--vit_small_patch14_dinov2.lvd142m"
    shutil.copytree(FIXTURES / "timm_dinov2", repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT),
           "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, "-c", NAMED, FIXTURES / "timm_dinov2_io.npz"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert float(done.stdout.split("max-diff")[1].split()[0]) < 1e-5
    assert "the Hugging Face hub id 'timm/deit3_small_patch16_224.fb_in1k'" in done.stdout


def test_a_tag_of_another_builder_and_a_missing_variant_are_refused():
    with pytest.raises(ValueError, match=r"DeiT3_S16 has the released weights \['fb_in1k', 'fb_in22k_ft_in1k'\]"):
        keras_vit.DeiT3_S16(weights="lvd142m")
    with pytest.raises(ValueError, match=r"CLIP_B16 has no register variant; received registers=True"):
        keras_vit.CLIP_B16(registers=True)


def test_pretrained_md_lists_the_family_weights():
    docs = (ROOT / "docs" / "PRETRAINED.md").read_text()
    assert families.markdown_table() in docs
