"""Register tokens and MAP pooling: the builder, and timm's files (tests/fixtures/timm_extra, written by timm).

`make_timm_extra_fixtures.py` saves timm ViTs with `reg_tokens` and
`global_pool="map"` by timm's own `save_for_hf`, with timm's logits.
"""

import os

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import checkpoints

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "timm_extra")
SMALL = dict(patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2, image_size=32, classes=5)


def _io(case):
    with np.load(os.path.join(FIXTURES, f"{case}_io.npz")) as io:
        return dict(io)


@pytest.mark.parametrize("case, fields", [
    ("reg4_gap", dict(num_register_tokens=4, classifier="gap", class_token=True, no_embed_class=True, fc_norm=True)),
    ("reg2_token", dict(num_register_tokens=2, classifier="token", no_embed_class=False)),
    ("map_reg", dict(num_register_tokens=2, classifier="map", class_token=True, no_embed_class=True)),
])
@pytest.mark.parametrize("scan_layers", [False, True])
def test_timm_files_give_timms_logits(case, fields, scan_layers):
    model = keras_vit.ViT.from_checkpoint(os.path.join(FIXTURES, case), classifier_activation=None,
                                          scan_layers=scan_layers)
    config = model.vit_config
    assert {name: getattr(config, name) for name in fields} == fields
    assert config.num_prefix_tokens == int(config.class_token) + config.num_register_tokens
    io = _io(case)
    np.testing.assert_allclose(np.asarray(model(io["inputs"])), io["logits"], atol=1e-4)


def test_registers_come_after_the_class_token_and_get_positions_as_it_does():
    tokens = {}
    for no_embed_class in (False, True):
        model = keras_vit.ViT(**SMALL, num_register_tokens=3, no_embed_class=no_embed_class)
        table = model.get_layer("position_embedding").weights[0]
        assert tuple(table.shape) == (1, 16 + (0 if no_embed_class else 4), 32)
        tokens[no_embed_class] = model
    # The sequence: class token, the 3 registers, the patches (timm's order).
    model = tokens[True]
    model.get_layer("class_token").token.assign(np.full((1, 1, 32), 7.0))
    model.get_layer("register_tokens").tokens.assign(np.arange(3 * 32, dtype="float32").reshape(1, 3, 32))
    model.get_layer("position_embedding").weights[0].assign(np.zeros((1, 16, 32)))
    sequence = keras.Model(model.input, model.get_layer("position_embedding").output)
    out = np.asarray(sequence(np.zeros((1, 32, 32, 3), "float32")))
    assert out.shape == (1, 20, 32)
    np.testing.assert_array_equal(out[0, 0], 7.0)
    np.testing.assert_array_equal(out[0, 1:4], np.arange(96).reshape(3, 32))


@pytest.mark.parametrize("classifier", ["gap", "map", "token"])
def test_pooling_leaves_the_registers_out(classifier):
    model = keras_vit.ViT(**SMALL, num_register_tokens=2, classifier=classifier, include_top=False)
    pooled = keras.Model(model.input, model.get_layer("encoder_norm").output)
    base = np.random.default_rng(0).normal(size=(1, 32, 32, 3)).astype("float32")
    tokens = np.asarray(pooled(base))
    prefix = model.vit_config.num_prefix_tokens
    assert tokens.shape[1] == prefix + 16
    # Changing a register's output leaves a gap or MAP feature unchanged: pool the tokens with one register moved.
    layer = model.get_layer("map_head" if classifier == "map" else "pooling")
    moved = tokens.copy()
    moved[:, prefix - 1] += 5.0
    same = np.asarray(layer(moved)), np.asarray(layer(tokens))
    np.testing.assert_allclose(*same, atol=1e-6)


def test_map_models_round_trip_through_keras_and_npz(tmp_path):
    model = keras_vit.ViT(**SMALL, classifier="map", num_register_tokens=2, class_token=True, no_embed_class=True,
                          classifier_activation=None)
    for weight in model.weights:  # a zero head would hide a head that is not loaded
        weight.assign(np.random.default_rng(len(weight.path)).normal(0, 0.2, weight.shape))
    images = np.random.default_rng(1).normal(size=(2, 32, 32, 3)).astype("float32")
    expected = np.asarray(model(images))
    model.save(tmp_path / "m.keras")
    np.testing.assert_array_equal(np.asarray(keras.models.load_model(tmp_path / "m.keras")(images)), expected)
    checkpoints.save_npz(model, tmp_path / "m.npz")
    arrays = np.load(tmp_path / "m.npz")
    assert arrays["MAPHead_0/probe"].shape == (1, 1, 32) and arrays["reg"].shape == (1, 2, 32)
    assert arrays["MAPHead_0/MultiHeadDotProductAttention_0/query/kernel"].shape == (32, 2, 16)
    assert arrays["MAPHead_0/MlpBlock_0/Dense_1/kernel"].shape == (64, 32)
    reloaded = keras_vit.ViT.from_checkpoint(tmp_path / "m.npz", classifier_activation=None)
    assert reloaded.vit_config == model.vit_config
    np.testing.assert_allclose(np.asarray(reloaded(images)), expected, atol=1e-6)


def test_map_is_a_builder_option_that_trains():
    model = keras_vit.ViT(**SMALL, classifier="map")
    assert not model.vit_config.class_token and model.vit_config.num_prefix_tokens == 0
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    before = model.get_layer("map_head").probe.numpy().copy()
    images = np.random.default_rng(0).normal(size=(4, 32, 32, 3)).astype("float32")
    model.get_layer("head").kernel.assign(np.random.default_rng(1).normal(size=(32, 5)))  # gradients past the head
    model.fit(images, np.arange(4) % 5, epochs=1, verbose=0)
    assert not np.array_equal(before, model.get_layer("map_head").probe.numpy())


def test_bad_register_configurations_are_refused():
    with pytest.raises(ValueError, match=r"`num_register_tokens` must be an int >= 0; received num_register_tokens=-1"):
        keras_vit.ViTConfig(num_register_tokens=-1)
    with pytest.raises(ValueError, match=r"distilled=True \(DeiT\) has no register tokens.*num_register_tokens=2"):
        keras_vit.ViTConfig(distilled=True, num_register_tokens=2)
    with pytest.raises(ValueError, match=r"`classifier` must be one of \('token', 'gap', 'map', 'token_and_gap'\)"):
        keras_vit.ViTConfig(classifier="attention")


def test_rollout_of_a_map_model_follows_the_probe():
    from keras_vit import analysis

    model = keras_vit.ViT(**SMALL, classifier="map", num_register_tokens=1)
    for weight in model.weights:
        weight.assign(np.random.default_rng(len(weight.path)).normal(0, 0.5, weight.shape))
    images = np.random.default_rng(0).normal(size=(1, 32, 32, 3)).astype("float32")
    rollout = analysis.attention_rollout(analysis.attention_maps(model, images))
    head = model.get_layer("map_head")
    _, scores = head(keras.Model(model.input, head.input)(images), return_attention_scores=True)
    probe = np.asarray(scores)[:, :, 0].mean(axis=1)  # (1, 16): the probe's weights over the patches
    assert np.ptp(probe) > 1e-3  # not uniform, so the MAP map differs from the GAP map
    expected = (probe[0] @ rollout[0, 1:, 1:]).reshape(4, 4)
    got = analysis.rollout_map(model, images)[0]
    # rollout_map upsamples the 4x4 grid to 32x32 and scales to [0, 1]: compare the grid cells' centres' order.
    centres = got[4::8, 4::8]
    assert np.argmax(centres) == np.argmax(expected) and np.argmin(centres) == np.argmin(expected)


def test_register_and_map_architecture_table_is_what_timm_builds():
    import json

    from keras_vit.checkpoints import timm

    with open(os.path.join(FIXTURES, "architectures.json")) as f:
        timm_built = json.load(f)["architectures"]
    assert set(timm_built) == set(timm.REGISTER_AND_MAP_ARCHITECTURES)
    for name, args in timm.REGISTER_AND_MAP_ARCHITECTURES.items():
        facts = timm_built[name]
        mlp_dim = int(args["embed_dim"] * args.get("mlp_ratio", 4.0))
        ours = dict(embed_dim=args["embed_dim"], depth=args["depth"], num_heads=args["num_heads"], mlp_dim=mlp_dim,
                    patch_size=[args["patch_size"]] * 2, img_size=[args["img_size"]] * 2,
                    class_token=args.get("class_token", True), reg_tokens=args.get("reg_tokens", 0),
                    global_pool=args["global_pool"], no_embed_class=args.get("no_embed_class", False),
                    fc_norm=args["global_pool"] == "avg", qkv_bias=True, layer_scale=False, gelu="none",
                    map_mlp_dim=mlp_dim if args["global_pool"] == "map" else None)
        assert ours == facts, name
