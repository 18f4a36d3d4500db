import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from keras_vit import analysis
from keras_vit import layers as vit_layers
from tests.layer_checks import randomize_weights

# A 2 x 3 patch grid: rectangles catch rows and columns swapped.
TINY = dict(patch_size=4, hidden_size=16, mlp_dim=32, num_heads=2, num_layers=3, image_size=(8, 12), classes=5)
IMAGES = np.random.default_rng(0).uniform(-1, 1, (2, 8, 12, 3)).astype("float32")


def tiny(**kwargs):
    model = keras_vit.ViT(**{**TINY, **kwargs})
    randomize_weights(model, scale=0.3)
    return model


def scanned_twin(unrolled):
    """A scan_layers=True model holding `unrolled`'s weights (blocks stacked)."""
    scanned = keras_vit.ViT(unrolled.vit_config.replace(scan_layers=True))
    blocks = [unrolled.get_layer(f"encoder_block_{i}") for i in range(unrolled.vit_config.num_layers)]
    scanned.get_layer("encoder").load_blocks(blocks)
    for layer in scanned.layers:
        if layer.name != "encoder":
            layer.set_weights(unrolled.get_layer(layer.name).get_weights())
    return scanned


def distilled_model():
    """A DeiT-style model (class and distillation tokens) assembled from the layers: two prefix tokens."""
    images = keras.Input((8, 12, 3))
    patches = vit_layers.PatchEmbedding(4, 16, name="patch_embedding")(images)
    tokens = [vit_layers.ClassToken()(patches), vit_layers.DistillationToken()(patches)]
    prefix = keras.layers.Concatenate(axis=1)(tokens)
    tokens = vit_layers.PositionEmbedding(grid_size=(2, 3), num_prefix_tokens=2, name="position_embedding")(
        patches, prefix_tokens=prefix)
    for i in range(2):
        tokens = vit_layers.EncoderBlock(num_heads=2, mlp_dim=32, name=f"encoder_block_{i}")(tokens)
    tokens = keras.layers.LayerNormalization(epsilon=1e-6, name="encoder_norm")(tokens)
    model = keras.Model(images, vit_layers.SequencePooling("token", 2, name="pooling")(tokens))
    randomize_weights(model)
    return model


def blocks_own_scores(model, images):
    """Each block's weights as EncoderBlock returns them, run eagerly one after the other."""
    tokens = keras.Model(model.input, model.get_layer("encoder_block_0").input)(images)
    scores = []
    for i in range(model.vit_config.num_layers):
        tokens, weights = model.get_layer(f"encoder_block_{i}")(tokens, return_attention_scores=True)
        scores.append(np.asarray(weights))
    return scores


def mean_pair_distance(rows, cols, patch):
    """Mean centre distance over every ordered pair of patches (self pairs included), by brute force."""
    cells = list(itertools.product(range(rows), range(cols)))
    pairs = itertools.product(cells, cells)
    return np.mean([np.hypot((a - c) * patch[0], (b - d) * patch[1]) for (a, b), (c, d) in pairs])


# --- attention maps


@pytest.mark.parametrize("classifier", ["token", "gap"])
def test_attention_maps_are_what_each_block_returns(classifier):
    model = tiny(classifier=classifier)
    maps = analysis.attention_maps(model, IMAGES)
    tokens = 6 + (classifier == "token")
    assert [m.shape for m in maps] == [(2, 2, tokens, tokens)] * 3
    for got, expected in zip(maps, blocks_own_scores(model, IMAGES), strict=True):
        np.testing.assert_allclose(got, expected, atol=1e-6)
    np.testing.assert_allclose(maps[-1].sum(-1), 1.0, atol=1e-5)


def test_attention_model_is_built_once_per_model():
    model = tiny()
    analysis.attention_maps(model, IMAGES)
    cached = analysis.attention.attention_model(model)
    analysis.attention_maps(model, IMAGES[:1])
    assert analysis.attention.attention_model(model) is cached
    assert analysis.attention.attention_model(tiny()) is not cached


def test_scanned_model_gives_the_unrolled_models_maps_and_intermediates():
    unrolled = tiny(position_embedding="relative")
    scanned = scanned_twin(unrolled)
    for got, expected in zip(analysis.attention_maps(scanned, IMAGES), analysis.attention_maps(unrolled, IMAGES),
                             strict=True):
        np.testing.assert_allclose(got, expected, atol=1e-6)
    got, expected = (analysis.intermediates(m)(IMAGES) for m in (scanned, unrolled))
    assert sorted(got) == sorted(expected) == [f"encoder_block_{i}" for i in range(3)]
    for block in expected:
        for key in ("prefix_tokens", "patch_tokens"):
            np.testing.assert_allclose(np.asarray(got[block][key]), np.asarray(expected[block][key]), atol=1e-5)


def test_uniform_attention_has_the_grids_mean_distance():
    # Zero queries: every logit is 0, so each query attends to all tokens alike.
    model = tiny()
    for i in range(3):
        attention = model.get_layer(f"encoder_block_{i}").attention
        attention.query_kernel.assign(np.zeros(attention.query_kernel.shape))
        attention.query_bias.assign(np.zeros(attention.query_bias.shape))
    maps = analysis.attention_maps(model, IMAGES)
    np.testing.assert_allclose(maps[0], 1 / 7, atol=1e-7)
    distance = analysis.mean_attention_distance(maps, (2, 3), 4, num_prefix_tokens=1)
    assert distance.shape == (3, 2)
    np.testing.assert_allclose(distance, mean_pair_distance(2, 3, (4, 4)), rtol=1e-6)
    # The class token's rollout row is flat over the patches: nothing to show.
    np.testing.assert_array_equal(analysis.rollout_map(model, IMAGES), np.zeros((2, 8, 12)))


def test_two_prefix_tokens():
    model = distilled_model()
    maps = analysis.attention_maps(model, IMAGES)
    assert [m.shape for m in maps] == [(2, 2, 8, 8)] * 2
    split = analysis.intermediates(model, indices=-1)(IMAGES)["encoder_block_1"]
    assert tuple(split["prefix_tokens"].shape) == (2, 2, 16) and tuple(split["patch_tokens"].shape) == (2, 6, 16)
    rollout = analysis.attention_rollout(maps)
    expected = tf.image.resize(rollout[:, 0, 2:].reshape(2, 2, 3, 1), (8, 12), "bilinear").numpy()[..., 0]
    expected = (expected - expected.min((1, 2), keepdims=True)) / np.ptp(expected, (1, 2), keepdims=True)
    np.testing.assert_allclose(analysis.rollout_map(model, IMAGES), expected, atol=1e-5)


def test_a_distilled_deits_rollout_reads_both_tokens_its_output_averages():
    model = tiny(distilled=True, classes=5)
    rollout = analysis.attention_rollout(analysis.attention_maps(model, IMAGES))
    both = rollout[:, :2, 2:].mean(axis=1)
    assert np.abs(both - rollout[:, 0, 2:]).max() > 1e-3  # the class token's row alone differs
    expected = tf.image.resize(both.reshape(2, 2, 3, 1), (8, 12), "bilinear").numpy()[..., 0]
    expected = (expected - expected.min((1, 2), keepdims=True)) / np.ptp(expected, (1, 2), keepdims=True)
    np.testing.assert_allclose(analysis.rollout_map(model, IMAGES), expected, atol=1e-5)


def test_dinov2s_rollout_reads_the_class_token_and_the_patches_and_skips_the_registers():
    """DINOv2's classifier (class token beside the mean of the patches) with 2 registers: the mean of the class
    token's row and the patches' rows, over the patches only; intermediates put the registers among the prefix."""
    model = tiny(classifier="token_and_gap", num_register_tokens=2, layer_scale_init=0.5, gated_mlp=True,
                 activation="silu")
    maps = analysis.attention_maps(model, IMAGES)
    assert [m.shape for m in maps] == [(2, 2, 9, 9)] * 3
    rollout = analysis.attention_rollout(maps)
    both = (rollout[:, 0, 3:] + rollout[:, 3:, 3:].mean(axis=1)) / 2
    expected = tf.image.resize(both.reshape(2, 2, 3, 1), (8, 12), "bilinear").numpy()[..., 0]
    expected = (expected - expected.min((1, 2), keepdims=True)) / np.ptp(expected, (1, 2), keepdims=True)
    np.testing.assert_allclose(analysis.rollout_map(model, IMAGES), expected, atol=1e-5)
    split = analysis.intermediates(model, indices=-1, norm=True)(IMAGES)["encoder_block_2"]
    assert tuple(split["prefix_tokens"].shape) == (2, 3, 16) and tuple(split["patch_tokens"].shape) == (2, 6, 16)


@pytest.mark.parametrize("scan_layers", [False, True])
def test_any_resolution_with_dynamic_image_size(scan_layers):
    model = tiny(dynamic_image_size=True, scan_layers=scan_layers)
    images = np.zeros((1, 16, 8, 3), "float32")  # a 4 x 2 grid
    assert [m.shape for m in analysis.attention_maps(model, images)] == [(1, 2, 9, 9)] * 3
    assert analysis.rollout_map(model, images).shape == (1, 16, 8)
    grids = analysis.intermediates(model, output="grid")(images)
    assert [tuple(g.shape) for g in grids.values()] == [(1, 4, 2, 16)] * 3


# --- intermediates


def test_last_intermediate_with_norm_is_the_encoded_sequence():
    model = tiny()
    encoded = keras.Model(model.input, model.get_layer("encoder_norm").output)(IMAGES).numpy()
    split = analysis.intermediates(model, indices=[-1], norm=True)(IMAGES)["encoder_block_2"]
    np.testing.assert_allclose(split["prefix_tokens"].numpy(), encoded[:, :1], atol=1e-6)
    np.testing.assert_allclose(split["patch_tokens"].numpy(), encoded[:, 1:], atol=1e-6)
    grid = analysis.intermediates(model, indices=2, norm=True, output="grid")(IMAGES)["encoder_block_2"]
    np.testing.assert_allclose(grid.numpy(), encoded[:, 1:].reshape(2, 2, 3, 16), atol=1e-6)


def test_intermediates_follow_the_indices_and_share_the_weights():
    model = tiny(classifier="gap")
    outputs = analysis.intermediates(model, indices=[-1, 0, 2])(IMAGES)
    assert sorted(outputs) == ["encoder_block_0", "encoder_block_2"]
    first, last = outputs["encoder_block_0"], outputs["encoder_block_2"]
    assert first["prefix_tokens"].shape == (2, 0, 16)
    after_block_0 = keras.Model(model.input, model.get_layer("encoder_block_0").output)(IMAGES).numpy()
    np.testing.assert_allclose(first["patch_tokens"].numpy(), after_block_0, atol=1e-6)
    features = analysis.intermediates(model, indices=-1)
    bias = model.get_layer("encoder_block_2").mlp.dense_2.bias
    bias.assign(bias.numpy() + 1)  # the last block's output moves by 1
    moved = features(IMAGES)["encoder_block_2"]["patch_tokens"].numpy()
    np.testing.assert_allclose(moved, last["patch_tokens"].numpy() + 1, atol=1e-5)


def test_an_fc_norm_model_has_no_sequence_norm_to_apply():
    model = tiny(classifier="gap", fc_norm=True)
    with pytest.raises(ValueError, match="has none .*fc_norm.*pass norm=False"):
        analysis.intermediates(model, norm=True)
    assert len(analysis.intermediates(model)(IMAGES)) == 3


def test_intermediates_save_as_keras_and_trace_with_an_unknown_batch(tmp_path):
    model = tiny()
    features = analysis.intermediates(model, indices=[1, 2], output="grid")
    features.save(tmp_path / "features.keras")
    restored = keras.models.load_model(tmp_path / "features.keras")
    got, expected = restored(IMAGES), features(IMAGES)
    assert sorted(got) == ["encoder_block_1", "encoder_block_2"]
    for block in expected:
        np.testing.assert_allclose(got[block].numpy(), expected[block].numpy(), atol=1e-6)
    scanned = analysis.intermediates(tiny(scan_layers=True, dynamic_image_size=True), output="grid")
    serve = tf.function(scanned, input_signature=[tf.TensorSpec((None, None, None, 3), tf.float32)])
    concrete = serve.get_concrete_function()
    assert [tuple(o.shape) for o in concrete.structured_outputs.values()] == [(None, None, None, 16)] * 3
    assert tuple(serve(IMAGES[:1])["encoder_block_0"].shape) == (1, 2, 3, 16)
    assert tuple(serve(np.zeros((3, 16, 8, 3), "float32"))["encoder_block_2"].shape) == (3, 4, 2, 16)


# --- rollout and distance (pure functions)


def test_identity_attention_rolls_out_to_the_identity_and_looks_nowhere():
    maps = [np.broadcast_to(np.eye(8), (2, 3, 8, 8))] * 4  # 2 prefix tokens + a 2 x 3 grid
    for fusion in analysis.attention.HEAD_FUSIONS:
        np.testing.assert_allclose(analysis.attention_rollout(maps, fusion), np.broadcast_to(np.eye(8), (2, 8, 8)))
    distance = analysis.mean_attention_distance(maps, (2, 3), (4, 6), num_prefix_tokens=2)
    np.testing.assert_array_equal(distance, np.zeros((4, 3)))


def test_rollout_of_uniform_attention():
    # With U the uniform matrix (U @ U = U), ((U + I) / 2)^L = I / 2^L + (1 - 1 / 2^L) U.
    maps = np.full((3, 1, 2, 5, 5), 1 / 5)
    expected = np.eye(5) / 8 + (1 - 1 / 8) / 5
    np.testing.assert_allclose(analysis.attention_rollout(maps)[0], expected)


def test_head_fusion_and_discard():
    heads = np.stack([np.eye(3), np.full((3, 3), 1 / 3)])[None]
    for fusion, fused in (("mean", (np.eye(3) + 1 / 3) / 2), ("max", np.maximum(np.eye(3), 1 / 3)),
                          ("min", np.minimum(np.eye(3), 1 / 3))):
        step = fused + np.eye(3)
        np.testing.assert_allclose(analysis.attention_rollout([heads], fusion)[0], step / step.sum(-1, keepdims=True))
    # Discarding the smallest 6 of 9 entries of max-fused weights keeps the diagonal only.
    np.testing.assert_allclose(analysis.attention_rollout([heads], "max", discard_ratio=6 / 9)[0], np.eye(3))


def test_mean_distance_weights_keys_and_drops_prefix_tokens():
    # Query patch (0, 0) of a 1 x 3 grid: 3/4 on itself, 1/4 on patch (0, 2), 10 px away; the rest on the prefix.
    weights = np.zeros((1, 1, 4, 4))
    weights[0, 0, 1:, 1:] = np.eye(3) * 0.3
    weights[0, 0, 1, 3] = 0.1
    weights[0, 0, :, 0] = 1 - weights[0, 0].sum(-1)
    distance = analysis.mean_attention_distance([weights], (1, 3), (4, 5), num_prefix_tokens=1)
    np.testing.assert_allclose(distance, [[0.25 * 10 / 3]])


# --- embeddings


def test_learned_1d_position_similarity():
    model = tiny()
    similarity = analysis.position_embedding_similarity(model)
    assert similarity.shape == (2, 3, 2, 3)
    flat = similarity.reshape(6, 6)
    np.testing.assert_allclose(np.diag(flat), 1.0)
    np.testing.assert_allclose(flat, flat.T)
    table = model.get_layer("position_embedding").embedding.numpy()[0, 1:]  # the class token's row left out
    a, b = table[1], table[3]  # patches (0, 1) and (1, 0)
    np.testing.assert_allclose(similarity[0, 1, 1, 0], a @ b / np.linalg.norm(a) / np.linalg.norm(b), rtol=1e-5)


def test_learned_2d_position_similarity_concatenates_rows_and_columns():
    model = tiny(position_embedding="learned_2d")
    layer = model.get_layer("position_embedding")
    layer.row_embedding.assign(np.array([[1.0] + [0.0] * 7, [0.0] * 7 + [1.0]]))
    layer.column_embedding.assign(np.eye(3, 8))
    similarity = analysis.position_embedding_similarity(model)
    # Same row, other column: (1, 0) . (1, 0) over two unit-norm halves; other row and column: 0.
    np.testing.assert_allclose(similarity[0, 0, 0, 1], 0.5, atol=1e-7)
    np.testing.assert_allclose(similarity[0, 0, 1, 1], 0.0, atol=1e-7)
    np.testing.assert_allclose(similarity[1, 2, 1, 2], 1.0, atol=1e-7)


@pytest.mark.parametrize("kind", ["sincos_2d", "relative", "none"])
def test_position_similarity_needs_a_learned_table(kind):
    with pytest.raises(ValueError, match=f"position_embedding='{kind}', which has none"):
        analysis.position_embedding_similarity(tiny(position_embedding=kind))


def test_filter_components_are_orthonormal():
    components, ratios = analysis.embedding_filter_components(tiny(), count=10)
    assert components.shape == (10, 4, 4, 3) and ratios.shape == (10,)
    flat = components.reshape(10, -1)
    np.testing.assert_allclose(flat @ flat.T, np.eye(10), atol=1e-10)
    assert ratios.sum() <= 1 + 1e-12 and np.all(np.diff(ratios) <= 0)


def test_filters_along_one_direction_have_one_component():
    model = tiny()
    direction = np.random.default_rng(1).normal(size=(4, 4, 3))
    scales = np.arange(16.0)
    model.get_layer("patch_embedding").kernel.assign(direction[..., None] * scales + 0.5)
    components, ratios = analysis.embedding_filter_components(model, count=2)
    unit = direction.ravel() / np.linalg.norm(direction)
    np.testing.assert_allclose(abs(components[0].ravel() @ unit), 1.0, atol=1e-5)
    np.testing.assert_allclose(ratios, [1.0, 0.0], atol=1e-6)


# --- errors


def test_rollout_takes_numpy_ratios_and_an_empty_batch():
    maps = [np.full((2, 2, 3, 3), 1 / 3)] * 2
    np.testing.assert_allclose(analysis.attention_rollout(maps, discard_ratio=np.float32(0.5)),
                               analysis.attention_rollout(maps, discard_ratio=0.5))
    assert analysis.attention_rollout([np.zeros((0, 2, 3, 3))]).shape == (0, 3, 3)


def test_errors_name_what_was_expected_and_received():
    model = tiny()
    cases = [
        (lambda: analysis.attention_maps(model, IMAGES[0]),
         r"\(batch, 8, 12, 3\).*received images of shape \(8, 12, 3\)"),
        (lambda: analysis.attention_maps(model, np.zeros((1, 8, 8, 3))), r"received images of shape \(1, 8, 8, 3\)"),
        (lambda: analysis.intermediates(model, indices=[3]), r"\[-3, 3\).*received indices=\[3\]"),
        (lambda: analysis.intermediates(model, output="grids"), r"`output` must be one of .*received output='grids'"),
        (lambda: analysis.attention_rollout([], "mean"), "non-empty list"),
        (lambda: analysis.attention_rollout([np.zeros((1, 2, 3, 3))], "sum"), "received head_fusion='sum'"),
        (lambda: analysis.attention_rollout([np.zeros((1, 2, 3, 3))], discard_ratio=1.0), "received discard_ratio=1.0"),
        (lambda: analysis.attention_rollout([np.zeros((1, 2, 3, 4))]), r"received shapes \[\(1, 2, 3, 4\)\]"),
        (lambda: analysis.mean_attention_distance([np.zeros((1, 1, 7, 7))], (2, 3), 4, 2), r"7 tokens.*\(2 \+ 6\)"),
        # 1.7 was read as 1.
        (lambda: analysis.mean_attention_distance([np.zeros((1, 1, 7, 7))], (2, 3), 4, 1.7),
         r"`num_prefix_tokens` must be an integer >= 0; received num_prefix_tokens=1.7"),
        (lambda: analysis.embedding_filter_components(model, count=49), r"\[1, 16\].*received count=49"),
        (lambda: analysis.attention_maps(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]), IMAGES),
         "must be a keras_vit ViT"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    with pytest.raises(TypeError, match="received indices='last'"):
        analysis.intermediates(model, indices="last")
