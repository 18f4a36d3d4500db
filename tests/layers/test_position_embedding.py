import numpy as np
import pytest

from keras_vit.layers import PositionEmbedding
from keras_vit.layers.position_embedding import sincos_2d
from tests.layer_checks import check_layer, randomize_weights

PATCHES = np.random.default_rng(3).normal(size=(2, 2, 3, 8)).astype("float32")
PREFIX = np.random.default_rng(4).normal(size=(2, 1, 8)).astype("float32")


@pytest.mark.parametrize("kind", ["learned_1d", "learned_2d", "sincos_2d", "none"])
def test_standard_checks(tmp_path, kind):
    layer = PositionEmbedding(kind, grid_size=(2, 3), num_prefix_tokens=1)
    out = check_layer(layer, tmp_path, PATCHES, prefix_tokens=PREFIX)
    assert out.shape == (2, 7, 8)


def test_learned_1d_adds_one_row_per_position_prefix_first():
    layer = PositionEmbedding("learned_1d", grid_size=(2, 3), num_prefix_tokens=1)
    layer(PATCHES, prefix_tokens=PREFIX)
    randomize_weights(layer)
    table = layer.embedding.numpy()[0]  # (1 + 6, 8): the official (1, 1+N, D) layout
    assert table.shape == (7, 8)
    out = np.asarray(layer(PATCHES, prefix_tokens=PREFIX))
    expected = np.concatenate([PREFIX, PATCHES.reshape(2, 6, 8)], axis=1) + table
    np.testing.assert_allclose(out, expected, atol=1e-6)


def test_learned_2d_concatenates_row_and_column_halves():
    layer = PositionEmbedding("learned_2d", grid_size=(2, 3), num_prefix_tokens=0)
    layer(PATCHES)
    randomize_weights(layer)
    rows, cols = layer.row_embedding.numpy(), layer.column_embedding.numpy()
    assert rows.shape == (2, 4) and cols.shape == (3, 4)
    out = np.asarray(layer(PATCHES)).reshape(2, 2, 3, 8)
    # Patch (1, 2) gets [row 1 | column 2].
    np.testing.assert_allclose(out[:, 1, 2], PATCHES[:, 1, 2] + np.concatenate([rows[1], cols[2]]), atol=1e-6)


def test_two_d_kinds_leave_prefix_tokens_alone():
    for kind in ("learned_2d", "sincos_2d", "none"):
        out = np.asarray(PositionEmbedding(kind, grid_size=(2, 3))(PATCHES, prefix_tokens=PREFIX))
        np.testing.assert_array_equal(out[:, :1], PREFIX)


def test_sincos_values_by_hand():
    table = np.asarray(sincos_2d(2, 3, 8))  # width 8: 2 frequencies, 1 and 1e-4
    assert table.shape == (6, 8)
    np.testing.assert_allclose(table[0], [0, 0, 1, 1, 0, 0, 1, 1], atol=1e-7)
    # Patch (row 1, column 2): sin(2), sin(2e-4), cos(2), cos(2e-4), then row 1.
    np.testing.assert_allclose(
        table[5], [np.sin(2), np.sin(2e-4), np.cos(2), np.cos(2e-4),
                   np.sin(1), np.sin(1e-4), np.cos(1), np.cos(1e-4)], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind", ["learned_1d", "learned_2d", "sincos_2d"])
def test_resampling_in_graph_equals_resized_weights(kind):
    """A grid other than `grid_size` is resampled in the graph exactly as
    `resized_weights` resamples the tables for a layer built at that grid."""
    layer = PositionEmbedding(kind, grid_size=(2, 3), num_prefix_tokens=1)
    layer(PATCHES, prefix_tokens=PREFIX)
    randomize_weights(layer)
    patches = np.random.default_rng(5).normal(size=(2, 4, 5, 8)).astype("float32")
    dynamic = np.asarray(layer(patches, prefix_tokens=PREFIX))
    target = PositionEmbedding(kind, grid_size=(4, 5), num_prefix_tokens=1)
    target(patches, prefix_tokens=PREFIX)
    for weight in target.weights:
        weight.assign(layer.resized_weights((4, 5))[weight.name])
    np.testing.assert_allclose(dynamic, np.asarray(target(patches, prefix_tokens=PREFIX)), atol=1e-5)


def test_resized_weights_follow_scipy_zoom_and_keep_the_prefix_row():
    from scipy import ndimage

    layer = PositionEmbedding("learned_1d", grid_size=(2, 3), num_prefix_tokens=1)
    layer(PATCHES, prefix_tokens=PREFIX)
    randomize_weights(layer)
    table = layer.embedding.numpy()[0]
    resized = layer.resized_weights((5, 4))["embedding"][0]
    np.testing.assert_array_equal(resized[0], table[0])
    zoomed = ndimage.zoom(table[1:].reshape(2, 3, 8), (5 / 2, 4 / 3, 1), order=1)
    np.testing.assert_allclose(resized[1:], zoomed.reshape(20, 8), atol=1e-6)


def test_bicubic_is_offered():
    layer = PositionEmbedding("learned_1d", grid_size=(2, 3), num_prefix_tokens=0, interpolation="bicubic")
    layer(PATCHES)
    randomize_weights(layer)
    bilinear = PositionEmbedding("learned_1d", grid_size=(2, 3), num_prefix_tokens=0)
    bilinear(PATCHES)
    bilinear.embedding.assign(layer.embedding.numpy())
    a, b = layer.resized_weights((4, 6))["embedding"], bilinear.resized_weights((4, 6))["embedding"]
    assert a.shape == b.shape and np.abs(a - b).max() > 1e-3


@pytest.mark.parametrize("kwargs, call, message", [
    (dict(kind="learned_3d"), None, "received kind='learned_3d'"),
    (dict(interpolation="nearest"), None, "received interpolation='nearest'"),
    (dict(grid_size=(2, 3), num_prefix_tokens=2), "prefix",
     r"num_prefix_tokens=2; received prefix_tokens of shape \(2, 1, 8\)"),
    (dict(kind="sincos_2d", grid_size=(2, 3), num_prefix_tokens=0), "width6", "divisible by 4; received 6"),
])
def test_bad_arguments(kwargs, call, message):
    with pytest.raises(ValueError, match=message):
        layer = PositionEmbedding(**kwargs)
        if call == "prefix":
            layer(PATCHES, prefix_tokens=PREFIX)
        elif call == "width6":
            layer(PATCHES[..., :6])
