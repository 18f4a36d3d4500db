"""keras_vit against the golden fixtures: official-format weights loaded here
must give timm's logits (tests/fixtures/make_fixtures.py made them)."""

import io
import json
import logging
import os
import pathlib

import numpy as np
import pytest

import keras_vit
from keras_vit import checkpoints
from tests.layer_checks import randomize_weights

FIXTURES = pathlib.Path(__file__).parents[1] / "fixtures"
CASES = json.loads((FIXTURES / "cases.json").read_text())["cases"]
ATOL = 1e-4


def build(case, **kwargs):
    c = CASES[case]
    resnet = c["resnet"] and dict(resnet_num_layers=tuple(c["resnet"]["num_layers"]),
                                  resnet_width_factor=c["resnet"]["width_factor"])
    return keras_vit.ViT(
        **(resnet or {}),
        patch_size=c["patch_size"], hidden_size=c["hidden_size"], mlp_dim=c["mlp_dim"],
        num_heads=c["num_heads"], num_layers=c["num_layers"], image_size=tuple(c["image_size"]),
        classes=c["num_classes"], classifier=c["classifier"],
        representation_size=c["representation_size"], classifier_activation=None, **kwargs,
    )


@pytest.mark.parametrize("case", ["token", "gap", "representation", "resize", "rectangular", "hybrid"])
def test_logits_match_timm(case):
    io = np.load(FIXTURES / f"{case}_io.npz")
    model = checkpoints.load_npz(build(case), FIXTURES / f"{case}.npz")
    logits = np.asarray(model(io["images"]))
    np.testing.assert_allclose(logits, io["logits"], atol=ATOL)
    assert np.abs(io["logits"]).max() > 0.5  # the fixture is not trivially small


def test_resize_on_load_is_the_official_zoom():
    model = checkpoints.load_npz(build("resize"), FIXTURES / "resize.npz")
    expected = np.load(FIXTURES / "resize_io.npz")["pos_embedding_resized"]
    np.testing.assert_allclose(model.get_layer("position_embedding").embedding.numpy(), expected, atol=1e-6)


@pytest.mark.parametrize("case", ["token", "gap", "representation", "rectangular", "hybrid"])
def test_save_then_load_is_bit_exact(tmp_path, case):
    source = checkpoints.read_npz(FIXTURES / f"{case}.npz")
    model = checkpoints.load_npz(build(case), FIXTURES / f"{case}.npz")
    path = checkpoints.save_npz(model, tmp_path / "out.npz")
    written = checkpoints.read_npz(path)
    # Official kinds are read back from their shapes alone; a non-square grid is not, so it is stored.
    stored = {checkpoints.CONFIG_KEY} if case == "rectangular" else set()
    assert sorted(written) == sorted(set(source) | stored)
    for key in source:
        np.testing.assert_array_equal(written[key], source[key], err_msg=key)
    assert not list(tmp_path.glob("*.tmp-*"))
    assert checkpoints.config_from_checkpoint(path) == model.vit_config


@pytest.mark.parametrize("case", ["token", "gap", "representation", "hybrid"])
def test_from_checkpoint_reads_the_architecture_off_an_official_file(case):
    c, io = CASES[case], np.load(FIXTURES / f"{case}_io.npz")
    config = keras_vit.config_from_checkpoint(FIXTURES / f"{case}.npz")
    assert config == build(case).vit_config
    assert (config.num_layers, config.num_heads, config.classes, c["classifier"]) == (2, 4, 10, config.classifier)
    model = keras_vit.ViT.from_checkpoint(FIXTURES / f"{case}.npz", classifier_activation=None)
    np.testing.assert_allclose(np.asarray(model(io["images"])), io["logits"], atol=ATOL)


def test_a_non_square_official_grid_is_given_by_image_size():
    with pytest.raises(ValueError, match="not a square grid; give its grid: `image_size=\\(height, width\\)`"):
        keras_vit.config_from_checkpoint(FIXTURES / "rectangular.npz")
    model = keras_vit.ViT.from_checkpoint(FIXTURES / "rectangular.npz", image_size=(32, 48), classifier_activation=None)
    io = np.load(FIXTURES / "rectangular_io.npz")
    np.testing.assert_allclose(np.asarray(model(io["images"])), io["logits"], atol=ATOL)


TINY = dict(patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2, image_size=32, classes=5)


@pytest.mark.parametrize("fields, stored", [
    (dict(position_embedding="learned_2d"), False),
    (dict(position_embedding="relative", classifier="gap"), False),
    (dict(position_embedding="relative_2d"), False),
    (dict(position_embedding="sincos_2d", classifier="gap"), True),
    (dict(position_embedding="none"), True),
    (dict(classes=0), False),
    (dict(resnet_num_layers=(), patch_size=2, representation_size=16), False),
    (dict(fc_norm=True, classifier="gap", class_token=True, gelu_approximate=False), True),
], ids=["learned_2d", "relative", "relative_2d", "sincos_2d", "none", "headless", "hybrid_root", "timm_avg"])
def test_every_kind_round_trips_through_its_file(tmp_path, fields, stored):
    model = keras_vit.ViT(**{**TINY, **fields}, classifier_activation=None)
    randomize_weights(model, scale=0.2)
    path = checkpoints.save_npz(model, tmp_path / "m.npz")
    assert (checkpoints.CONFIG_KEY in checkpoints.read_npz(path)) == stored
    assert keras_vit.config_from_checkpoint(path) == model.vit_config
    loaded = keras_vit.ViT.from_checkpoint(path, classifier_activation=None)
    images = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    np.testing.assert_allclose(np.asarray(loaded(images)), np.asarray(model(images)), atol=1e-5)
    rewritten = checkpoints.read_npz(checkpoints.save_npz(loaded, tmp_path / "again.npz"))
    original = checkpoints.read_npz(path)
    assert sorted(rewritten) == sorted(original)
    for key in original:
        np.testing.assert_array_equal(rewritten[key], original[key], err_msg=key)


def test_an_official_file_without_position_tables_must_be_told_its_kind(tmp_path):
    arrays = checkpoints.read_npz(FIXTURES / "gap.npz")
    del arrays["Transformer/posembed_input/pos_embedding"]
    np.savez(tmp_path / "nopos.npz", **arrays)
    with pytest.raises(ValueError, match="nopos.npz has no position table.*'sincos_2d' or 'none'"):
        keras_vit.config_from_checkpoint(tmp_path / "nopos.npz")


def test_a_file_that_is_not_a_vit_names_what_it_lacks(tmp_path):
    np.savez(tmp_path / "other.npz", foo=np.zeros(3))
    with pytest.raises(ValueError, match="other.npz is not a ViT checkpoint.*no 'embedding/kernel'.*'foo'"):
        keras_vit.config_from_checkpoint(tmp_path / "other.npz")
    with pytest.raises(ValueError, match="received 'model.pt'"):
        keras_vit.config_from_checkpoint("model.pt")


def test_fine_tuning_drops_pre_logits_and_restarts_the_head(caplog):
    """The official fine-tuning from ImageNet-21k: no representation layer, a new zero head."""
    io = np.load(FIXTURES / "representation_io.npz")
    model = keras_vit.ViT.from_checkpoint(FIXTURES / "representation.npz", classes=3, representation_size=None)
    assert "pre_logits" not in [layer.name for layer in model.layers]
    assert not model.get_layer("head").kernel.numpy().any() and model.output_shape == (None, 3)
    features = keras_vit.ViT.from_checkpoint(FIXTURES / "representation.npz", include_top=False,
                                             representation_size=None)
    full = keras_vit.ViT.from_checkpoint(FIXTURES / "representation.npz", include_top=False)
    # The pooled encoder output is untouched: pre_logits is tanh(dense(features)).
    dense = full.get_layer("pre_logits")
    np.testing.assert_allclose(np.tanh(np.asarray(features(io["images"])) @ dense.kernel.numpy() + dense.bias.numpy()),
                               io["pre_logits"], atol=ATOL)


def test_a_headless_file_gives_a_model_a_zero_head():
    model = keras_vit.ViT(**{**TINY, "classes": 0})
    headless = checkpoints.save_npz(model, pathlib.Path(__import__("tempfile").mkdtemp()) / "f.npz")
    with_head = keras_vit.ViT.from_checkpoint(headless, classes=7)
    assert with_head.output_shape == (None, 7) and not with_head.get_layer("head").kernel.numpy().any()


@pytest.mark.parametrize("case", ["token", "hybrid"])
def test_a_scanned_encoder_reads_and_writes_the_official_format(tmp_path, case):
    io = np.load(FIXTURES / f"{case}_io.npz")
    model = checkpoints.load_npz(build(case, scan_layers=True), FIXTURES / f"{case}.npz")
    assert "encoder" in [layer.name for layer in model.layers]
    np.testing.assert_allclose(np.asarray(model(io["images"])), io["logits"], atol=ATOL)
    source = checkpoints.read_npz(FIXTURES / f"{case}.npz")
    written = checkpoints.read_npz(checkpoints.save_npz(model, tmp_path / "out.npz"))
    assert sorted(written) == sorted(source)
    for key in source:
        np.testing.assert_array_equal(written[key], source[key], err_msg=key)


def test_relative_tables_for_another_grid_need_the_unrolled_blocks(tmp_path):
    tiny = dict(patch_size=8, hidden_size=64, mlp_dim=128, num_heads=4, num_layers=2,
                position_embedding="relative")
    path = checkpoints.save_npz(keras_vit.ViT(**tiny, image_size=32), tmp_path / "m.npz")
    checkpoints.load_npz(keras_vit.ViT(**tiny, image_size=32, scan_layers=True), path)
    with pytest.raises(ValueError, match="made for another grid.*scan_layers=False"):
        checkpoints.load_npz(keras_vit.ViT(**tiny, image_size=48, scan_layers=True), path)


def test_another_architecture_is_refused_with_every_difference_named():
    wrong = keras_vit.ViT(patch_size=8, hidden_size=64, mlp_dim=128, num_heads=4, num_layers=3,
                          image_size=32, classes=10)
    with pytest.raises(ValueError) as error:
        checkpoints.load_npz(wrong, FIXTURES / "representation.npz")
    message = str(error.value)
    assert ("it looks like an unnamed configuration "
            "(hidden 64, 2 blocks, 4 heads, patch 8, 10 classes, pre_logits 32)") in message
    assert "Missing keys: ['Transformer/encoderblock_2/LayerNorm_0/scale'" in message
    assert "Unexpected keys: []" in message  # the pre_logits the model lacks are dropped, as official fine-tuning


def test_other_classes_reinitialise_the_head_to_zero():
    model = keras_vit.ViT(patch_size=8, hidden_size=64, mlp_dim=128, num_heads=4, num_layers=2,
                          image_size=32, classes=3)
    randomize_weights(model)
    checkpoints.load_npz(model, FIXTURES / "token.npz")
    assert not model.get_layer("head").kernel.numpy().any()
    assert model.get_layer("encoder_norm").gamma.numpy().any()


def test_a_model_without_top_takes_the_features_of_a_full_checkpoint():
    model = keras_vit.ViT(patch_size=8, hidden_size=64, mlp_dim=128, num_heads=4, num_layers=2,
                          image_size=32, include_top=False)
    checkpoints.load_npz(model, FIXTURES / "token.npz")
    io = np.load(FIXTURES / "token_io.npz")
    np.testing.assert_allclose(np.asarray(model(io["images"])), io["pre_logits"], atol=ATOL)


@pytest.mark.parametrize("position_embedding", ["learned_2d", "relative", "relative_2d"])
def test_keras_vit_kinds_round_trip_and_resize_through_the_format(tmp_path, position_embedding):
    tiny = dict(patch_size=8, hidden_size=64, mlp_dim=128, num_heads=4, num_layers=2, classes=10,
                classifier_activation=None, position_embedding=position_embedding)
    source = keras_vit.ViT(**tiny, image_size=(32, 48))
    randomize_weights(source, scale=0.2)
    path = checkpoints.save_npz(source, tmp_path / "m.npz")
    same = checkpoints.load_npz(keras_vit.ViT(**tiny, image_size=(32, 48)), path)
    images = np.random.default_rng(0).uniform(-1, 1, (2, 32, 48, 3)).astype("float32")
    np.testing.assert_array_equal(np.asarray(same(images)), np.asarray(source(images)))
    bigger = checkpoints.load_npz(keras_vit.ViT(**tiny, image_size=(48, 64)), path)
    attention = bigger.get_layer("encoder_block_1").attention
    if position_embedding == "relative_2d":
        assert attention.relative_embedding.shape == (11, 15, 4, 16)
        return
    # Resized on load = resampled in the graph by a dynamic model.
    dynamic = keras_vit.ViT(**tiny, image_size=(32, 48), dynamic_image_size=True)
    dynamic.set_weights(source.get_weights())
    larger = np.random.default_rng(1).uniform(-1, 1, (2, 48, 64, 3)).astype("float32")
    np.testing.assert_allclose(np.asarray(bigger(larger)), np.asarray(dynamic(larger)), atol=1e-5)


def test_non_square_source_grid_must_be_named():
    model = keras_vit.ViT(patch_size=8, hidden_size=64, mlp_dim=128, num_heads=4, num_layers=2,
                          image_size=48, classes=10)
    with pytest.raises(ValueError, match="not a square grid; give its grid.*`source_grid_size=\\(rows, cols\\)`"):
        checkpoints.load_npz(model, FIXTURES / "rectangular.npz")
    checkpoints.load_npz(model, FIXTURES / "rectangular.npz", source_grid_size=(4, 6))


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    model = checkpoints.load_npz(build("token"), FIXTURES / "token.npz")
    path = tmp_path / "m.npz"
    path.write_bytes(b"previous checkpoint")

    def broken_rename(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_rename)  # a local file is renamed into place by Python
    with pytest.raises(OSError, match="disk full"):
        checkpoints.save_npz(model, path)
    assert path.read_bytes() == b"previous checkpoint" and list(tmp_path.iterdir()) == [path]


def test_weights_argument_takes_an_npz_path():
    io = np.load(FIXTURES / "gap_io.npz")
    model = keras_vit.ViT(patch_size=8, hidden_size=64, mlp_dim=128, num_heads=4, num_layers=2, image_size=32,
                          classes=10, classifier="gap", classifier_activation=None, weights=str(FIXTURES / "gap.npz"))
    np.testing.assert_allclose(np.asarray(model(io["images"])), io["logits"], atol=ATOL)


def test_describe_names_official_variants_and_hybrids():
    b16 = {checkpoints.official_key(w.path)[0]: np.zeros(w.shape, np.float32)
           for w in keras_vit.ViT_B16(representation_size=768, classes=21843).weights}
    assert checkpoints.describe(b16) == (
        "ViT-B/16 (hidden 768, 12 blocks, 12 heads, patch 16, 21843 classes, pre_logits 768)")
    hybrid = {checkpoints.official_key(w.path)[0]: np.zeros(w.shape, np.float32)
              for w in keras_vit.R26_ViT_S32().weights}
    assert checkpoints.describe(hybrid).startswith(
        "R26+ViT-S/32 (hidden 384, 12 blocks, 6 heads, patch 1, ResNet stages (2, 2, 2, 2)")
    assert "no 'embedding/kernel'" in checkpoints.describe({"foo": np.zeros(1)})


def test_loading_a_b16_file_into_an_s16_model_names_the_file_variant(tmp_path):
    path = tmp_path / "b.npz"
    np.savez(path, **{checkpoints.official_key(w.path)[0]: np.zeros(w.shape, np.float32)
                      for w in keras_vit.ViT_B32().weights})
    with pytest.raises(ValueError, match=r"it looks like ViT-B/32 \(hidden 768"):
        checkpoints.load_npz(keras_vit.ViT_S32(), path)


def test_bicubic_load_is_pytorchs_interpolate():
    """`interpolation="bicubic"` resizes as timm does (F.interpolate bicubic)."""
    from keras_vit.resize import interpolation_matrix

    io = np.load(FIXTURES / "bicubic_io.npz")
    np.testing.assert_allclose(
        np.asarray(interpolation_matrix(4, 6, "bicubic", "float64")), io["bicubic_matrix_4_to_6"], atol=1e-12)
    c = CASES["bicubic"]
    model = keras_vit.ViT(patch_size=8, hidden_size=64, mlp_dim=128, num_heads=4, num_layers=2,
                          image_size=tuple(c["image_size"]), classes=10, classifier_activation=None,
                          interpolation="bicubic")
    checkpoints.load_npz(model, FIXTURES / "bicubic.npz")
    np.testing.assert_allclose(model.get_layer("position_embedding").embedding.numpy(),
                               io["pos_embedding_resized"], atol=1e-6)
    np.testing.assert_allclose(np.asarray(model(io["images"])), io["logits"], atol=ATOL)


def _bad_npz_bytes(kind):
    whole = (FIXTURES / "token.npz").read_bytes()
    if kind == "one array":
        buffer = io.BytesIO()
        np.save(buffer, np.zeros(3))
        return buffer.getvalue()
    return {"cut short": whole[: len(whole) // 2], "empty": b"",
            "damaged inside": whole[:200] + bytes(200) + whole[400:]}[kind]


@pytest.mark.parametrize("kind", ["cut short", "empty", "damaged inside", "one array"])
def test_a_broken_npz_is_a_value_error_naming_the_file(kind, tmp_path):
    path = tmp_path / "ViT-B_16.npz"
    path.write_bytes(_bad_npz_bytes(kind))
    with pytest.raises(ValueError, match="is not a whole .npz checkpoint") as error:
        checkpoints.read_npz(path)
    assert str(path) in str(error.value)


def _randomized(**fields):
    model = keras_vit.ViT(**fields)
    randomize_weights(model)
    return model


def _corner_aligned(grid, rows, cols):
    """Corner-aligned bilinear resize of a (h, w, D) grid with numpy's interp, axis by axis."""
    def along(values, size, axis):
        where = np.linspace(0, values.shape[axis] - 1, size)
        return np.apply_along_axis(lambda v: np.interp(where, np.arange(len(v)), v), axis, values)
    return along(along(grid, rows, 0), cols, 1)


@pytest.mark.parametrize("image_size", [(32, 32), (64, 16), (32, 64)])
def test_a_stated_non_square_grid_is_resized_from_itself(image_size, tmp_path):
    # (16, 64) at patch 8 is a (2, 8) grid of 16 rows, as many as a square (4, 4) grid.
    source = _randomized(**{**TINY, "image_size": (16, 64)})
    path = checkpoints.save_npz(source, tmp_path / "wide.npz")
    table = source.get_layer("position_embedding").embedding.numpy()[0]
    rows, cols = image_size[0] // 8, image_size[1] // 8
    expected = np.concatenate([table[:1], _corner_aligned(table[1:].reshape(2, 8, -1), rows, cols).reshape(
        rows * cols, -1)])
    for model in (checkpoints.load_npz(keras_vit.ViT(**{**TINY, "image_size": image_size}), path),
                  keras_vit.ViT.from_checkpoint(path, image_size=image_size)):
        np.testing.assert_allclose(model.get_layer("position_embedding").embedding.numpy()[0], expected, atol=1e-6)


@pytest.mark.parametrize("field, value", [("gelu_approximate", False), ("layer_norm_epsilon", 1e-5),
                                          ("position_embedding", "sincos_2d"), ("input_mean", (0.485, 0.456, 0.406)),
                                          ("classifier", "gap")])
def test_a_file_stating_other_numerics_is_refused(field, value, tmp_path):
    fields = {**TINY, field: value, **({"class_token": True} if field == "classifier" else {})}
    path = checkpoints.save_npz(_randomized(**fields), tmp_path / "other.npz")
    with pytest.raises(ValueError, match=rf"computes otherwise than 'plain': {field}: model .*, file ") as error:
        checkpoints.load_npz(keras_vit.ViT(**{**TINY, **({"class_token": True} if field == "classifier" else {})},
                                           name="plain"), path)
    assert str(path) in str(error.value) and "from_checkpoint" in str(error.value)
    if field != "position_embedding":  # a learned table the file lacks cannot be chosen
        default = keras_vit.config.ViTConfig.__dataclass_fields__[field].default
        chosen = keras_vit.ViT.from_checkpoint(path, **{field: default})  # an override is a choice, not a mistake
        assert getattr(chosen.vit_config, field) == default


def test_a_timm_config_json_states_its_numerics():
    directory = FIXTURES / "timm" / "augreg"
    stated = checkpoints.config_from_checkpoint(directory)
    with pytest.raises(ValueError, match="gelu_approximate: model True, file False"):
        keras_vit.ViT(stated.replace(gelu_approximate=True), weights=str(directory))
    assert keras_vit.ViT(stated, weights=str(directory)).vit_config == stated


def test_the_head_restarts_with_the_pre_logits_it_read(tmp_path):
    # representation_size == hidden_size: the head's shape fits a model without pre_logits, its inputs do not.
    source = _randomized(**TINY, representation_size=32)
    path = checkpoints.save_npz(source, tmp_path / "pre_logits.npz")
    for model in (checkpoints.load_npz(keras_vit.ViT(**TINY), path),
                  keras_vit.ViT.from_checkpoint(path, representation_size=None)):
        assert "pre_logits" not in [layer.name for layer in model.layers]
        assert not np.any(model.get_layer("head").kernel.numpy())


def test_a_scanned_model_loads_a_stated_file_with_relative_tables(tmp_path):
    # exact GELU makes the file state its configuration; the tables sit in the scanned encoder's stack
    fields = {**TINY, "position_embedding": "relative", "gelu_approximate": False}
    source = _randomized(**fields)
    path = checkpoints.save_npz(source, tmp_path / "relative.npz")
    scanned = checkpoints.load_npz(keras_vit.ViT(**fields, scan_layers=True), path)
    images = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    np.testing.assert_allclose(np.asarray(scanned(images)), np.asarray(source(images)), atol=1e-5)


# Run with TensorFlow unimportable (as where it is not installed), on Keras' JAX backend.
_WITHOUT_TENSORFLOW = """
import json, os, sys
sys.modules["tensorflow"] = None
import keras
import numpy as np
import keras_vit
from keras_vit import checkpoints

fixtures, out = sys.argv[1], sys.argv[2]
model = keras_vit.ViT.from_checkpoint(os.path.join(fixtures, "token.npz"), classifier_activation=None)
io = np.load(os.path.join(fixtures, "token_io.npz"))
error = float(np.abs(keras.ops.convert_to_numpy(model(io["images"])) - io["logits"]).max())
again = keras_vit.ViT.from_checkpoint(checkpoints.save_npz(model, os.path.join(out, "m.npz")))
same = all(np.array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b))
           for a, b in zip(model.weights, again.weights))
try:
    checkpoints.read_npz("gs://bucket/m.npz")
    remote = None
except ImportError as exc:
    remote = str(exc)
tensorflow = sorted(name for name, module in sys.modules.items() if name.split(".")[0] == "tensorflow" and module)
print(json.dumps(dict(backend=keras.backend.backend(), error=error, same=same, remote=remote, tensorflow=tensorflow)))
"""


def test_official_files_load_and_save_without_tensorflow(tmp_path):
    # A JAX or PyTorch user's environment has no TensorFlow: local files are read and written by Python alone,
    # and only a path with a scheme asks for TensorFlow, by name.
    import subprocess
    import sys

    env = {**os.environ, "KERAS_BACKEND": "jax"}
    result = subprocess.run([sys.executable, "-c", _WITHOUT_TENSORFLOW, str(FIXTURES), str(tmp_path)], env=env,
                            cwd=pathlib.Path(__file__).parents[2], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["backend"] == "jax" and found["tensorflow"] == []
    assert found["error"] < ATOL and found["same"]
    assert "gs://bucket/m.npz" in found["remote"] and "install tensorflow" in found["remote"]


def test_a_dropped_representation_layer_is_said_once_at_warning(caplog):
    # An ImageNet-21k file (pre_logits + head) loaded for fine-tuning: one line saying what happened.
    with caplog.at_level(logging.INFO):
        model = keras_vit.ViT.from_checkpoint(FIXTURES / "representation.npz", representation_size=None, classes=3)
    said = [r for r in caplog.records if "at zero" in r.getMessage()]
    assert len(said) == 1 and said[0].levelname == "WARNING", caplog.text
    assert "pre_logits layer and the head that read it are dropped" in said[0].getMessage()
    assert not model.get_layer("head").kernel.numpy().any()
