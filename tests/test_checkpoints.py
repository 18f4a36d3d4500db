"""keras_vit against the golden fixtures: official-format weights loaded here
must give timm's logits (tests/fixtures/make_fixtures.py made them)."""

import json
import pathlib

import numpy as np
import pytest

import keras_vit
from keras_vit import checkpoints
from tests.layer_checks import randomize_weights

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
CASES = json.loads((FIXTURES / "cases.json").read_text())["cases"]
ATOL = 1e-4


def build(case):
    c = CASES[case]
    resnet = c["resnet"] and dict(resnet_num_layers=tuple(c["resnet"]["num_layers"]),
                                  resnet_width_factor=c["resnet"]["width_factor"])
    return keras_vit.ViT(
        **(resnet or {}),
        patch_size=c["patch_size"], hidden_size=c["hidden_size"], mlp_dim=c["mlp_dim"],
        num_heads=c["num_heads"], num_layers=c["num_layers"], image_size=tuple(c["image_size"]),
        classes=c["num_classes"], classifier=c["classifier"],
        representation_size=c["representation_size"], classifier_activation=None,
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
    assert sorted(written) == sorted(source)
    for key in source:
        np.testing.assert_array_equal(written[key], source[key], err_msg=key)
    assert not list(tmp_path.glob("*.tmp-*"))


def test_another_architecture_is_refused_with_every_difference_named():
    wrong = keras_vit.ViT(patch_size=8, hidden_size=64, mlp_dim=128, num_heads=4, num_layers=3,
                          image_size=32, classes=10)
    with pytest.raises(ValueError) as error:
        checkpoints.load_npz(wrong, FIXTURES / "representation.npz")
    message = str(error.value)
    assert "Missing keys: ['Transformer/encoderblock_2/LayerNorm_0/scale'" in message
    assert "Unexpected keys: ['pre_logits/bias', 'pre_logits/kernel']" in message


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
