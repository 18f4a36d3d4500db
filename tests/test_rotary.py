"""Rotary positions (keras_vit/positions/rotary.py): each kind against a numpy reference written from its paper and
reference code (not from our module), its place among the prefix tokens, any resolution, and the model's round trips.

The reference turns adjacent channel pairs (EVA02, RoPE-ViT) or the halves' channels (DINOv3) in place, as timm and
transformers do; keras_vit gives each pair back in halves, which leaves every logit as it is (test below).
"""

import math

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.layers import EncoderBlock
from keras_vit.layers.scanned_encoder import block_name
from keras_vit.positions import rotary
from tests import reference
from tests.layer_checks import check_layer, randomize_weights

KINDS = rotary.NAMES
TINY = dict(patch_size=4, hidden_size=16, mlp_dim=32, num_heads=2, num_layers=2, image_size=(8, 12), classes=0,
            position_embedding="none")
IMAGES = np.random.default_rng(0).uniform(-1, 1, (2, 8, 12, 3)).astype("float32")


def reference_angles(kind, rows, cols, head_dim, frequencies=None, reference_grid=(16, 16)):
    """`(heads or 1, rows * cols, head_dim / 2)` angles of each patch's pairs, from the families' definitions."""
    y, x = (a.ravel().astype(np.float64) for a in np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij"))
    quarter = head_dim // 4
    k = np.arange(quarter)
    if kind == "rope_mixed":  # RoPE-Mixed: learned (x, y) frequencies per head, here held (y, x)
        return y[None, :, None] * frequencies[0][:, None] + x[None, :, None] * frequencies[1][:, None]
    if kind == "rope_dinov3":  # periods 100 ** (4k / head_dim) of patch centres in (-1, 1)
        y, x = 2 * (y + 0.5) / rows - 1, 2 * (x + 0.5) / cols - 1
        bands = 2 * math.pi / 100.0 ** (4 * k / head_dim)
        return np.concatenate([np.outer(y, bands), np.outer(x, bands)], -1)[None]
    if kind == "rope_eva":  # EVA02: indices stretched onto the pretraining grid, rows first
        y, x = y / rows * reference_grid[0], x / cols * reference_grid[1]
        bands = 10000.0 ** (-k / quarter)
        return np.concatenate([np.outer(y, bands), np.outer(x, bands)], -1)[None]
    bands = 100.0 ** (-k / quarter)  # RoPE-ViT axial: raw indices, columns first
    return np.concatenate([np.outer(x, bands), np.outer(y, bands)], -1)[None]


def turned(kind, x, angles, prefix):
    """`x` `(batch, tokens, heads, head_dim)` with its patch tokens' pairs turned in place."""
    cos, sin = (f(angles).transpose(1, 0, 2)[None] for f in (np.cos, np.sin))  # (1, patches, heads or 1, pairs)
    patches = x[:, prefix:]
    if kind == "rope_dinov3":
        half = x.shape[-1] // 2
        a, b = patches[..., :half], patches[..., half:]
        out = np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)
    else:
        a, b = patches[..., 0::2], patches[..., 1::2]
        out = np.stack([a * cos - b * sin, b * cos + a * sin], -1).reshape(patches.shape)
    return np.concatenate([x[:, :prefix], out], 1)


def reference_block(kind, x, w, grid, prefix, eps=1e-6):
    """A pre-norm block with rotary positions, `attention_norm` and `mlp_norm` where `w` has them."""
    h = reference.norm(x, w, "norm_1", eps)
    q, k, v = (np.einsum("btd,dhk->bthk", h, w[f"{n}_kernel"]) + w.get(f"{n}_bias", 0.0)
               for n in ("query", "key", "value"))
    if "query_norm/gamma" in w:  # q/k norm, then the turn
        q, k = reference.norm(q, w, "query_norm", eps), reference.norm(k, w, "key_norm", eps)
    angles = reference_angles(kind, *grid, q.shape[-1], w.get("rope_frequencies"))
    q, k = turned(kind, q, angles, prefix), turned(kind, k, angles, prefix)
    weights = reference.softmax(np.einsum("bqhk,bthk->bhqt", q / np.sqrt(q.shape[-1]), k))
    out = np.einsum("bhqt,bthk->bqhk", weights, v)
    if "output_norm/gamma" in w:
        out = reference.norm(out.reshape(*out.shape[:2], -1), w, "output_norm", eps).reshape(out.shape)
    x = x + np.einsum("bqhk,hkd->bqd", out, w["output_kernel"]) + w["output_bias"]
    y = reference.gelu_tanh(reference.norm(x, w, "norm_2", eps) @ w["dense_1/kernel"] + w["dense_1/bias"])
    if "norm/gamma" in w:
        y = reference.norm(y, w, "norm", eps)
    return x + y @ w["dense_2/kernel"] + w["dense_2/bias"]


@pytest.mark.parametrize("kind, qk_norm", [(kind, False) for kind in KINDS] + [("rope_axial", True)])
def test_each_kind_turns_queries_and_keys_as_its_family_does(tmp_path, kind, qk_norm):
    """A block on a 2 x 3 grid behind a class token and a register, weights far from their starts; EVA's with the
    norms inside its attention and MLP; adjacent pairs behind a q/k norm, moved into halves after it. Its config,
    `.keras` round trip and gradients by check_layer."""
    eva = kind == "rope_eva"
    block = EncoderBlock(num_heads=2, mlp_dim=24, rotary_embedding=kind, grid_size=(2, 3), num_prefix_tokens=2,
                         rope_reference_grid=(16, 16) if eva else None, attention_norm=eva, mlp_norm=eva,
                         qk_norm=qk_norm)
    tokens = np.random.default_rng(1).normal(size=(2, 8, 16)).astype("float32")
    block(tokens)
    randomize_weights(block)
    weights = reference.block_weights(block)
    assert ("rope_frequencies" in weights) == (kind == "rope_mixed") and ("norm/gamma" in weights) == eva
    expected = reference_block(kind, np.float64(tokens), weights, (2, 3), prefix=2)
    np.testing.assert_allclose(np.asarray(block(tokens)), expected, atol=2e-5)
    unturned = EncoderBlock.from_config({**block.get_config(), "rotary_embedding": None, "rope_reference_grid": None})
    unturned(tokens)
    unturned.set_weights([w for w in block.get_weights() if w.shape != (2, 2, 4)])  # all but the frequencies
    assert np.abs(np.asarray(unturned(tokens)) - expected).max() > 1e-2  # the positions matter
    check_layer(block, tmp_path, tokens)  # the key's bias too: turned per token, it is no longer a shift softmax drops


def test_pairs_given_back_in_halves_leave_every_logit_as_it_is():
    rng = np.random.default_rng(2)
    q, k = rng.normal(size=(2, 2, 7, 16)), rng.normal(size=(2, 2, 7, 16))  # (batch, tokens, heads, head_dim)
    angles = rng.normal(size=(1, 2, 8))
    for kind in ("rope_axial", "rope_dinov3"):
        cos, sin = np.cos(angles).transpose(1, 0, 2), np.sin(angles).transpose(1, 0, 2)
        ours = [np.asarray(rotary.rotate(kind, t, cos, sin)) for t in (q, k)]
        ours_from_halves = [np.asarray(rotary.rotate(kind, np.asarray(rotary.halves_first(kind, t)), cos, sin,
                                                     in_halves=True)) for t in (q, k)]
        np.testing.assert_allclose(ours_from_halves[0], ours[0], atol=1e-12)
        theirs = [turned(kind, t, angles, 0) for t in (q, k)]
        np.testing.assert_allclose(np.einsum("bqhd,bkhd->bhqk", *ours), np.einsum("bqhd,bkhd->bhqk", *theirs),
                                   atol=1e-10)


def test_coordinates_per_kind_and_the_prefix_at_the_origin():
    np.testing.assert_array_equal(rotary.coordinates("rope_axial", (2, 3), 1),
                                  [[0, 0], [0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]])
    np.testing.assert_allclose(rotary.coordinates("rope_eva", (2, 4), 0, (16, 16))[:, 1], [0, 4, 8, 12] * 2)
    np.testing.assert_allclose(rotary.coordinates("rope_dinov3", (2, 2), 5)[5:], [[-.5, -.5], [-.5, .5], [.5, -.5],
                                                                                 [.5, .5]])
    dynamic = rotary.coordinates("rope_eva", (keras.ops.convert_to_tensor(2), keras.ops.convert_to_tensor(4)), 1,
                                 (16, 16))
    np.testing.assert_allclose(np.asarray(dynamic), rotary.coordinates("rope_eva", (2, 4), 1, (16, 16)))


@pytest.mark.parametrize("kind", KINDS)
def test_a_dynamic_model_at_any_size_is_the_model_built_for_that_grid(kind):
    """The run-time grid's coordinates are the fixed grid's: at the built size, and at another (EVA's reference grid
    kept, DINOv3's centres rescaled, RoPE-ViT's indices extended)."""
    fixed = keras_vit.ViT(**TINY, rotary_embedding=kind)
    randomize_weights(fixed)
    dynamic = keras_vit.ViT(fixed.vit_config.replace(dynamic_image_size=True))
    dynamic.set_weights(fixed.get_weights())
    np.testing.assert_allclose(np.asarray(dynamic(IMAGES)), np.asarray(fixed(IMAGES)), atol=1e-5)
    other = keras_vit.ViT(fixed.vit_config.replace(image_size=(16, 8)))
    other.set_weights(fixed.get_weights())
    larger = np.random.default_rng(3).uniform(-1, 1, (1, 16, 8, 3)).astype("float32")
    np.testing.assert_allclose(np.asarray(dynamic(larger)), np.asarray(other(larger)), atol=1e-5)
    assert other.vit_config.rope_reference_grid == fixed.vit_config.rope_reference_grid
    maps = [np.asarray(keras_vit.analysis.attention_maps(m, larger)) for m in (dynamic, other)]
    np.testing.assert_allclose(maps[0], maps[1], atol=1e-5)  # the analyses run the blocks on the run-time grid


@pytest.mark.parametrize("kind", ["rope_mixed", "rope_eva"])
def test_rotary_models_round_trip_and_scan_trim_and_map_as_the_unrolled_model(tmp_path, kind):
    options = dict(rotary_embedding=kind, classifier="token", num_register_tokens=1, position_embedding="learned_1d")
    if kind == "rope_eva":
        options.update(mlp_norm=True, attention_norm=True, rope_reference_grid=(4, 4))
    model = keras_vit.ViT(**{**TINY, **options})
    randomize_weights(model)
    expected = np.asarray(model(IMAGES))
    keras_vit.save_npz(model, tmp_path / "model.npz")
    loaded = keras_vit.ViT.from_checkpoint(tmp_path / "model.npz")
    assert loaded.vit_config == model.vit_config
    np.testing.assert_allclose(np.asarray(loaded(IMAGES)), expected, atol=1e-6)
    model.save(tmp_path / "model.keras")
    np.testing.assert_allclose(np.asarray(keras.models.load_model(tmp_path / "model.keras")(IMAGES)), expected,
                               atol=1e-6)
    scanned = keras_vit.ViT(**{**TINY, **options}, scan_layers=True)
    scanned.get_layer("encoder").load_blocks([model.get_layer(block_name(i)) for i in range(2)])
    by_path = {w.path: w for w in model.weights}
    for weight in scanned.weights:
        if not weight.path.startswith("encoder/"):
            weight.assign(by_path[weight.path].numpy())
    np.testing.assert_allclose(np.asarray(scanned(IMAGES)), expected, atol=1e-5)
    trimmed = keras_vit.trim_last_block(model)
    assert trimmed is not model
    np.testing.assert_allclose(np.asarray(trimmed(IMAGES)), expected, atol=1e-5)
    maps = np.asarray(keras_vit.analysis.attention_maps(model, IMAGES))
    assert maps.shape == (2, 2, 2, 8, 8)


@pytest.mark.parametrize("fields", [dict(rotary_embedding="rope_axial", num_register_tokens=1),
                                    dict(rotary_embedding="rope_mixed", dynamic_image_size=True, scan_layers=True)])
def test_patch_dropouts_kept_tokens_keep_their_own_rotations(tmp_path, fields):
    """timm's Eva gathers the rotary table by the kept indices; here each block gathers its angles by the kept
    tokens' places. Held to each example alone, its kept tokens given their coordinates through `coordinates`."""
    model, plain = (keras_vit.ViT(**TINY, **fields, patch_dropout=rate) for rate in (0.5, 0.0))
    randomize_weights(plain)
    by_path = {w.path: w for w in plain.weights}
    for weight in model.weights:
        if weight.path in by_path:
            weight.assign(by_path[weight.path])
    # At inference nothing is dropped or gathered: the model without PatchDropout's numbers, bit for bit.
    np.testing.assert_array_equal(np.asarray(model(IMAGES)), np.asarray(plain(IMAGES)))
    np.testing.assert_array_equal(np.asarray(keras_vit.analysis.attention_maps(model, IMAGES)),
                                  np.asarray(keras_vit.analysis.attention_maps(plain, IMAGES)))
    scanned = fields.get("scan_layers", False)
    last = model.get_layer("encoder" if scanned else block_name(1))
    kept, places, encoded = (np.asarray(t) for t in keras.Model(
        model.input, [*model.get_layer("patch_dropout").output, last.output])(IMAGES, training=True))
    prefix = model.vit_config.num_prefix_tokens
    assert kept.shape[1] == prefix + 3 and not np.array_equal(places[0], places[1])  # 3 of the 2 x 3 patches
    table = rotary.coordinates(fields["rotary_embedding"], (2, 3), prefix)
    for example in range(2):
        x = kept[example:example + 1]
        for i in range(2):
            coordinates = table[places[example]].astype("float32")
            x = (last.call_block(i, x, coordinates=coordinates) if scanned else
                 model.get_layer(block_name(i))(x, coordinates=coordinates))
        np.testing.assert_allclose(encoded[example:example + 1], np.asarray(x), atol=1e-5)
    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    assert loaded.get_layer("patch_dropout").get_config()["return_indices"]
    np.testing.assert_array_equal(np.asarray(loaded(IMAGES)), np.asarray(plain(IMAGES)))


@pytest.mark.parametrize("fields, message", [
    (dict(rotary_embedding="rope_axial", hidden_size=24, num_heads=4), "multiple of 4; received hidden_size=24"),
    (dict(rotary_embedding="rope_axial", rope_reference_grid=16), "rope_reference_grid is rope_eva's"),
    (dict(rope_theta=100.0), "received rotary_embedding=None with rope_theta=100.0"),
    (dict(rotary_embedding="rope_dinov3", position_embedding="relative"), "absolute table or none"),
    (dict(rotary_embedding="rope_2d"), "rotary_embedding"),
])
def test_rotary_fields_that_do_not_fit_are_refused_by_name(fields, message):
    with pytest.raises(ValueError, match=message):
        keras_vit.ViTConfig(**{**TINY, "image_size": 8, **fields}).replace()


def test_evas_reference_grid_is_fixed_when_the_config_is_made():
    config = keras_vit.ViTConfig(**{k: v for k, v in TINY.items() if k != "classes"}, rotary_embedding="rope_eva")
    assert config.rope_reference_grid == (2, 3) and config.replace(image_size=32).rope_reference_grid == (2, 3)


def test_rollout_and_attention_distance_read_a_rotary_models_run_time_grid():
    """DINOv3's kind: no table, registers, any size; the analyses take the grid of the images they are given."""
    model = keras_vit.ViT(**{**TINY, "classes": 3}, rotary_embedding="rope_dinov3", num_register_tokens=2,
                          dynamic_image_size=True)
    randomize_weights(model)
    images = np.random.default_rng(4).uniform(-1, 1, (1, 24, 16, 3)).astype("float32")
    maps = np.asarray(keras_vit.analysis.attention_maps(model, images))
    assert maps.shape == (2, 1, 2, 27, 27)  # class token, 2 registers, 6 x 4 patches
    assert np.asarray(keras_vit.analysis.rollout_map(model, images)).shape == (1, 24, 16)
    distances = keras_vit.analysis.mean_attention_distance(maps, (6, 4), 4, 3)
    assert distances.shape == (2, 2) and np.all((distances > 0) & (distances < 4 * np.hypot(6, 4)))
