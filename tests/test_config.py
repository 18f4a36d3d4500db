"""`ViTConfig` on the ground floor: it loads no framework, and each field's help, role and checks are its metadata."""

import dataclasses
import math
import pathlib
import subprocess
import sys

import pytest

from keras_vit import config as vit_config
from keras_vit.config import FIELDS, ROLES, ViTConfig

ROOT = pathlib.Path(__file__).parents[1]
FRAMEWORKS = ("keras", "tensorflow", "jax", "torch")


def loaded_frameworks(statement):
    """The FRAMEWORKS in sys.modules after `statement` runs in a fresh interpreter."""
    probe = f"import sys\n{statement}\nprint(sorted(m for m in {FRAMEWORKS!r} if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip()


@pytest.mark.parametrize("module", ["keras_vit", "keras_vit.config", "keras_vit.variants", "keras_vit.checks",
                                    "trainers.recipes", "trainers.train", "trainers.strategy"])
def test_the_ground_floor_imports_no_framework(module):
    assert loaded_frameworks(f"import {module}") == "[]"


def test_a_config_is_built_and_checked_without_a_framework():
    statement = ("from keras_vit.variants import decode_variant\n"
                 "assert decode_variant('R50+B/16').token_size == (16, 16)\n"
                 "try:\n    decode_variant('B/16').replace(hidden_size=0)\nexcept ValueError:\n    pass\n"
                 "else:\n    raise SystemExit('hidden_size=0 passed')")
    assert loaded_frameworks(statement) == "[]"


def test_the_role_tuples_are_the_fields_of_each_role():
    assert set(vit_config.CONVENTION_FIELDS) == {
        "classifier", "class_token", "distilled", "no_embed_class", "position_embedding", "gelu_approximate",
        "activation", "fc_norm", "layer_norm_epsilon", "input_mean", "input_std", "rotary_embedding", "rope_theta",
        "rope_reference_grid"}
    assert set(vit_config.DATA_FIELDS) == {"classes", "channels"}
    assert set(vit_config.TRAINING_FIELDS) == {
        "dropout_rate", "attention_dropout_rate", "drop_path_rate", "scan_layers", "remat", "patch_dropout"}
    assert vit_config.PAIRS == ("patch_size", "image_size", "rope_reference_grid")
    assert vit_config.PER_CHANNEL == ("input_mean", "input_std")
    assert {"hidden_size", "mlp_dim", "num_heads", "num_layers", "patch_size", "qkv_bias", "layer_scale_init",
            "patch_bias", "norm_pre"} <= {
        name for name, field in FIELDS.items() if field.metadata["role"] == vit_config.ARCHITECTURE}


@pytest.mark.parametrize("name", list(FIELDS))
def test_every_field_declares_its_help_and_role(name):
    metadata = FIELDS[name].metadata
    assert metadata["role"] in ROLES
    assert isinstance(metadata["help"], str) and len(metadata["help"]) > 10 and metadata["help"].endswith(".")


def bad_value(field):
    """A value the field's own metadata refuses."""
    meta = field.metadata
    if meta["form"] in (vit_config.PAIR, vit_config.INTS):
        return (0, 0)
    if meta["form"] == vit_config.PER_CHANNEL_FORM:
        return (0.25, 0.5)  # two values for three channels
    if meta["choices"]:
        return "no-such-choice"
    if field.type is bool:
        return 1
    if field.type is int:
        return meta["low"] - 1
    return math.nan


@pytest.mark.parametrize("name", list(FIELDS))
def test_every_field_is_checked_by_its_metadata(name):
    with pytest.raises(ValueError, match=rf"`{name}` must .*; received {name}="):
        ViTConfig(**{name: bad_value(FIELDS[name])})


def test_the_checks_keep_their_messages():
    with pytest.raises(ValueError, match=r"`hidden_size` must be an int >= 1; received hidden_size=True"):
        ViTConfig(hidden_size=True)
    with pytest.raises(ValueError, match=r"`dropout_rate` must be a float in \[0.0, 1\); received dropout_rate=1"):
        ViTConfig(dropout_rate=1)
    with pytest.raises(ValueError, match=r"`resnet_num_layers` must be an int >= 1; received resnet_num_layers=0"):
        ViTConfig(resnet_num_layers=(3, 0))
    assert ViTConfig(patch_size=1, resnet_num_layers=[3, 4, 9]).resnet_num_layers == (3, 4, 9)
    assert ViTConfig(patch_size=8, image_size=32).grid_size == (4, 4)


@pytest.mark.parametrize("position_embedding", ["relative", "relative_2d"])
def test_patch_dropout_refuses_relative_positions(position_embedding):
    # Their attention bias is made for every offset of the whole grid, not a subset of its patches.
    with pytest.raises(ValueError, match=rf"relative positions bias attention by offsets on the whole grid; received "
                                         rf"patch_dropout=0.5, position_embedding='{position_embedding}'"):
        ViTConfig(patch_dropout=0.5, position_embedding=position_embedding)
    assert ViTConfig(position_embedding=position_embedding).patch_dropout == 0.0
    with pytest.raises(ValueError, match=r"`patch_dropout` must be a float in \[0.0, 1\); received patch_dropout=1"):
        ViTConfig(patch_dropout=1)


def test_a_field_without_help_or_role_is_a_programming_error():
    with pytest.raises(ValueError, match=r"`role` must be one of .*received role='shape'"):
        vit_config._field(1, "shape", "A width.")
    assert dataclasses.fields(ViTConfig) == tuple(FIELDS.values())


@pytest.mark.parametrize("layers, stride", [((), 4), ((3, 4, 9), 16), ((3, 4, 6, 3), 32)])
def test_output_stride_of_the_resnet_stem(layers, stride):
    assert vit_config.output_stride(layers) == stride
    assert ViTConfig(patch_size=1, image_size=64, resnet_num_layers=layers).token_size == (stride, stride)


# The fields before LayerScale, norm_pre, patch_bias, activation and qkv_bias, as a file of then stores them.
OLD_FIELDS = ("patch_size", "hidden_size", "mlp_dim", "num_heads", "num_layers", "image_size", "channels", "classifier",
              "class_token", "distilled", "num_register_tokens", "position_embedding", "no_embed_class",
              "interpolation", "dynamic_image_size", "layer_norm_epsilon", "gelu_approximate", "dropout_rate",
              "attention_dropout_rate", "drop_path_rate", "scan_layers", "remat", "fc_norm", "representation_size",
              "classes", "resnet_num_layers", "resnet_width_factor", "input_mean", "input_std")


@pytest.mark.parametrize("approximate", [True, False])
def test_a_config_of_an_older_file_reads_as_it_was(approximate):
    old = {name: value for name, value in ViTConfig(gelu_approximate=approximate).to_dict().items()
           if name in OLD_FIELDS}
    assert set(old) == set(OLD_FIELDS)
    config = ViTConfig.from_dict(old)
    assert (config.activation, config.gelu_approximate) == ("gelu", approximate)
    # The new blocks are off: the official model, its weights and numerics.
    assert (config.qkv_bias, config.layer_scale_init, config.patch_bias, config.norm_pre) == ("all", None, True, False)
    assert (config.norm_layer, config.qk_norm, config.gated_mlp, config.patch_norm, config.projection_dim) == (
        "layer_norm", False, False, False, None)
    assert ViTConfig.from_dict(config.to_dict()) == config


def test_quick_gelu_holds_gelu_approximate_false():
    """QuickGELU has no GELU form: one config per function, so a file and a model that compute alike agree."""
    quick = ViTConfig(activation="quick_gelu")
    assert quick.gelu_approximate is False and quick == ViTConfig(activation="quick_gelu", gelu_approximate=False)
    assert quick.replace(activation="gelu").gelu_approximate is False  # what it held
    assert vit_config.differing_conventions(ViTConfig(), quick) == ["gelu_approximate", "activation"]
    assert vit_config.differing_conventions(ViTConfig(gelu_approximate=False), quick) == ["activation"]
    # gelu_approximate keeps its one meaning: overriding it alone (a checkpoint's, a flag) changes the GELU form.
    assert vit_config.differing_conventions(ViTConfig(), ViTConfig(gelu_approximate=False)) == ["gelu_approximate"]


def test_the_block_options_are_checked():
    assert ViTConfig(layer_scale_init=1e-5).layer_scale_init == 1e-5
    with pytest.raises(ValueError, match=r"`layer_scale_init` must be a float in \(0.0, inf\); received "
                                         r"layer_scale_init=0"):
        ViTConfig(layer_scale_init=0)  # timm's init_values=0 is no LayerScale: here that is None
    with pytest.raises(ValueError, match=r"`qkv_bias` must be one of \('all', 'none', 'qv'\); received qkv_bias=True"):
        ViTConfig(qkv_bias=True)
    with pytest.raises(ValueError, match=r"`norm_layer` must be one of \('layer_norm', 'rms_norm'\); received "
                                         r"norm_layer='rmsnorm'"):
        ViTConfig(norm_layer="rmsnorm")
    dinov2 = ViTConfig(classifier="token_and_gap")
    assert dinov2.class_token and dinov2.replace(classifier="gap").class_token is False
    with pytest.raises(ValueError, match=r"classifier='token_and_gap' pools the class token; received "
                                         r"class_token=False"):
        ViTConfig(classifier="token_and_gap", class_token=False)
    with pytest.raises(ValueError, match=r"a model has one; received projection_dim=8, representation_size=8"):
        ViTConfig(projection_dim=8, representation_size=8)
    with pytest.raises(ValueError, match=r"distilled=True \(DeiT\).*projection_dim=8"):
        ViTConfig(distilled=True, projection_dim=8)
