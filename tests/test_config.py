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
        "fc_norm", "layer_norm_epsilon", "input_mean", "input_std"}
    assert set(vit_config.DATA_FIELDS) == {"classes", "channels"}
    assert set(vit_config.TRAINING_FIELDS) == {
        "dropout_rate", "attention_dropout_rate", "drop_path_rate", "scan_layers", "remat"}
    assert vit_config.PAIRS == ("patch_size", "image_size")
    assert vit_config.PER_CHANNEL == ("input_mean", "input_std")
    assert {"hidden_size", "mlp_dim", "num_heads", "num_layers", "patch_size"} <= {
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


def test_a_field_without_help_or_role_is_a_programming_error():
    with pytest.raises(ValueError, match=r"`role` must be one of .*received role='shape'"):
        vit_config._field(1, "shape", "A width.")
    assert dataclasses.fields(ViTConfig) == tuple(FIELDS.values())


@pytest.mark.parametrize("layers, stride", [((), 4), ((3, 4, 9), 16), ((3, 4, 6, 3), 32)])
def test_output_stride_of_the_resnet_stem(layers, stride):
    assert vit_config.output_stride(layers) == stride
    assert ViTConfig(patch_size=1, image_size=64, resnet_num_layers=layers).token_size == (stride, stride)
