"""big_vision `.npz` files (tests/fixtures/timm_extra/bv_*.npz) read with the logits timm gives for them.

`make_timm_extra_fixtures.py` writes tiny ViTs in big_vision's layout and has
timm itself read each file (`_load_weights`, which knows big_vision's keys) for
the expected logits: a reference independent of keras_vit's reader.
"""

import os

import numpy as np
import pytest

import keras_vit
from keras_vit import checkpoints
from keras_vit.checkpoints import big_vision, official
from keras_vit.checkpoints.resolve import checkpoint_format

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "timm_extra")
OFFICIAL = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "token.npz")

CASES = {  # case: (from_checkpoint overrides, ViTConfig fields read)
    "bv_map": ({}, dict(classifier="map", class_token=False, position_embedding="learned_1d")),
    "bv_gap": ({}, dict(classifier="gap", class_token=False)),
    "bv_tok": ({}, dict(classifier="token", class_token=True, no_embed_class=True)),
    "bv_map_scan": ({}, dict(classifier="map", num_layers=2)),
    "bv_sincos": (dict(image_size=32), dict(classifier="gap", position_embedding="sincos_2d")),
}


def _path(case):
    return os.path.join(FIXTURES, f"{case}.npz")


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("scan_layers", [False, True])
def test_big_vision_files_give_timms_logits(case, scan_layers):
    overrides, fields = CASES[case]
    model = keras_vit.ViT.from_checkpoint(_path(case), classifier_activation=None, scan_layers=scan_layers,
                                          **overrides)
    config = model.vit_config
    assert {name: getattr(config, name) for name in fields} == fields
    # big_vision's numerics: tanh GELU, eps 1e-6, inputs in [-1, 1].
    assert config.gelu_approximate and config.layer_norm_epsilon == 1e-6 and config.input_mean == (0.5,) * 3
    with np.load(os.path.join(FIXTURES, f"{case}_io.npz")) as io:
        np.testing.assert_allclose(np.asarray(model(io["inputs"])), io["logits"], atol=1e-4)


def test_the_format_is_told_by_its_keys():
    assert checkpoint_format(_path("bv_map"))[0] is big_vision
    assert checkpoint_format(OFFICIAL)[0] is official
    assert not big_vision.matches(OFFICIAL)


def test_scanned_and_unrolled_files_read_the_same():
    _, unrolled = big_vision.read(_path("bv_map"))
    _, scanned = big_vision.read(_path("bv_map_scan"))
    assert sorted(unrolled) == sorted(scanned)
    for key in unrolled:
        np.testing.assert_array_equal(unrolled[key], scanned[key])


def test_a_resized_model_loads(tmp_path):
    # A learned table is resampled to a new grid as the official files are.
    model = keras_vit.ViT.from_checkpoint(_path("bv_map"), image_size=48)
    assert model.vit_config.grid_size == (6, 6)
    assert model.get_layer("position_embedding").weights[0].shape == (1, 36, 32)


def _write(tmp_path, arrays, name="f.npz"):
    path = str(tmp_path / name)
    np.savez(path, **arrays)
    return path


def test_prefixes_and_the_old_class_token_row_are_read(tmp_path):
    arrays = dict(np.load(_path("bv_tok")))
    prefixed = _write(tmp_path, {f"params/img/{k}": v for k, v in arrays.items()}, "prefixed.npz")
    assert checkpoints.config_from_checkpoint(prefixed) == checkpoints.config_from_checkpoint(_path("bv_tok"))
    # Older big_vision files: the class token's position row first (added after concatenation).
    old = dict(arrays, pos_embedding=np.concatenate([np.zeros((1, 1, 32), np.float32), arrays["pos_embedding"]], 1))
    config = checkpoints.config_from_checkpoint(_write(tmp_path, old, "old.npz"))
    assert not config.no_embed_class and config.grid_size == (4, 4)


def test_what_cannot_be_read_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"no pos_embedding \(big_vision's posemb='sincos2d'\).*pass image_size"):
        checkpoints.config_from_checkpoint(_path("bv_sincos"))
    arrays = dict(np.load(_path("bv_gap")))
    arrays["Transformer/encoderblock_1/LayerScale_0/gamma"] = np.ones(32, np.float32)
    with pytest.raises(ValueError, match=r"'Transformer/encoderblock_1/LayerScale_0/gamma' is no part of "
                                         r"big_vision's encoder block"):
        checkpoints.config_from_checkpoint(_write(tmp_path, arrays))
    arrays = dict(np.load(_path("bv_gap")), pos_embedding=np.zeros((1, 15, 32), np.float32))
    with pytest.raises(ValueError, match=r"pos_embedding holds 15 positions, not a square grid"):
        checkpoints.config_from_checkpoint(_write(tmp_path, arrays, "odd.npz"))


def test_a_map_file_without_its_probe_names_the_key(tmp_path):
    arrays = {k: v for k, v in np.load(_path("bv_map")).items() if k != "MAPHead_0/probe"}
    with pytest.raises(ValueError, match=r"holds a MAP head without its probe: expected 'MAPHead_0/probe'"):
        checkpoints.config_from_checkpoint(_write(tmp_path, arrays))


def test_load_npz_points_a_big_vision_file_to_load_checkpoint():
    model = keras_vit.ViT.from_checkpoint(_path("bv_gap"))
    before = [np.asarray(w) for w in model.weights]
    with pytest.raises(ValueError, match=r"bv_gap\.npz is a big_vision checkpoint .* not the official format "
                                         r"load_npz reads; use keras_vit\.checkpoints\.load_checkpoint"):
        checkpoints.load_npz(model, _path("bv_gap"))
    assert all(np.array_equal(a, np.asarray(w)) for a, w in zip(before, model.weights, strict=True))
