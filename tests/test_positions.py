import importlib

import numpy as np
import pytest

import keras_vit
from keras_vit import checkpoints, positions
from keras_vit.config import POSITION_EMBEDDINGS
from keras_vit.layers.attention import RELATIVE_POSITIONS
from keras_vit.layers.position_embedding import KINDS as ABSOLUTE_KINDS
from keras_vit.positions import PositionKind

TABLED = [name for name, kind in positions.KINDS.items() if kind.weight_names]
ROLES = {  # name: (adds_to_tokens, biases_attention)
    "learned_1d": (True, False), "learned_2d": (True, False), "sincos_2d": (True, False),
    "relative": (False, True), "relative_2d": (False, True), "none": (False, False),
}


def tables_at(kind, grid_size, prefix_rows=1, width=8, num_heads=2, seed=0):
    """Random float64 tables of `kind` made for `grid_size`."""
    rng = np.random.default_rng(seed)
    shapes = kind.weight_shapes(width, grid_size, prefix_rows, num_heads)
    return {name: rng.normal(size=shape) for name, shape in shapes.items()}


@pytest.mark.parametrize("name", POSITION_EMBEDDINGS)
def test_every_configurable_kind_is_a_registered_module(name):
    # A kind added to ViTConfig's POSITION_EMBEDDINGS needs keras_vit/positions/<name>.py and a row in KINDS.
    module = importlib.import_module(f"keras_vit.positions.{name}")
    assert isinstance(module.KIND, PositionKind) and module.KIND.name == name
    assert positions.get(name) is module.KIND


def test_the_registry_lists_exactly_the_configurable_kinds_in_their_order():
    assert tuple(positions.KINDS) == POSITION_EMBEDDINGS
    with pytest.raises(ValueError, match="received position_embedding='learned_3d'"):
        positions.get("learned_3d")


@pytest.mark.parametrize("name", POSITION_EMBEDDINGS)
def test_roles_and_the_layers_that_accept_each_kind(name):
    kind = positions.get(name)
    assert (kind.adds_to_tokens, kind.biases_attention) == ROLES[name]
    assert (name in RELATIVE_POSITIONS) == kind.biases_attention
    assert (name in ABSOLUTE_KINDS) == (not kind.biases_attention)


@pytest.mark.parametrize("name", POSITION_EMBEDDINGS)
def test_each_kind_implements_what_its_role_and_tables_need(name):
    kind = positions.get(name)

    def overridden(method):
        return getattr(type(kind), method) is not getattr(PositionKind, method)

    assert overridden("table") == kind.adds_to_tokens
    assert overridden("logits") == kind.biases_attention
    for method in ("resize", "file_grid"):
        assert overridden(method) == bool(kind.weight_names), method
    # Every weight has a checkpoint key, and every key names a weight.
    assert tuple(tables_at(kind, (2, 3))) == kind.weight_names


@pytest.mark.parametrize("name", TABLED)
def test_resize_to_the_own_grid_is_exact_and_corner_aligned_resizes_round_trip(name):
    kind = positions.get(name)
    # 2n - 1 samples keep the n originals at every other sample (corners aligned); relative's
    # 1-D offsets need a sequence of 2L - 1 offsets to double, hence its grids (1, 6) and (1, 11).
    small, large = ((1, 6), (1, 11)) if name == "relative" else ((2, 3), (3, 5))
    prefix = 0 if name == "relative" else 1
    tables = tables_at(kind, small, prefix)
    same = kind.resize(tables, small, prefix, "bilinear", source_grid=small)
    for table_name, table in tables.items():
        np.testing.assert_array_equal(same[table_name], table.astype(np.float32))
    up = kind.resize(tables, large, prefix, "bilinear", source_grid=small)
    assert {n: t.shape for n, t in up.items()} == {n: t.shape for n, t in tables_at(kind, large, prefix).items()}
    down = kind.resize({n: t.astype(np.float64) for n, t in up.items()}, small, prefix, "bilinear", source_grid=large)
    for table_name, table in tables.items():
        np.testing.assert_allclose(down[table_name], table, atol=1e-6, err_msg=table_name)


@pytest.mark.parametrize("name", TABLED)
def test_the_grid_is_read_back_from_the_tables(name):
    kind = positions.get(name)
    grid = (4, 4) if name in ("learned_1d", "relative") else (2, 3)  # 1-D tables give a square
    assert kind.file_grid(tables_at(kind, grid), 1, "file.npz") == grid
    if grid == (4, 4):
        with pytest.raises(ValueError, match="file.npz: .*holds 6 patch positions, not a square grid"):
            kind.file_grid(tables_at(kind, (2, 3)), 1, "file.npz")


def test_weightless_kinds_have_no_keys_and_are_never_found_in_a_file():
    for name in set(POSITION_EMBEDDINGS) - set(TABLED):
        kind = positions.get(name)
        assert not kind.checkpoint_keys and not kind.checkpoint_rules()
        assert not kind.in_file(kind.file_tables({"Transformer/posembed_input/pos_embedding": np.zeros((1, 5, 8))}))


@pytest.mark.parametrize("name", POSITION_EMBEDDINGS)
def test_keys_round_trip_through_a_file_and_name_one_kind(tmp_path, name):
    model = keras_vit.ViT(patch_size=8, hidden_size=16, mlp_dim=32, num_heads=2, num_layers=2, image_size=(16, 24),
                          classes=0, position_embedding=name)
    arrays = checkpoints.read_npz(checkpoints.save_npz(model, tmp_path / "m.npz"))
    kind = positions.get(name)
    layer = (model.get_layer("encoder_block_1").attention if kind.biases_attention
             else model.get_layer("position_embedding"))
    block = 1 if kind.biases_attention else 0
    assert {n: t.shape for n, t in kind.file_tables(arrays, block).items()} == \
        {n: tuple(getattr(layer, n).shape) for n in kind.weight_names}
    for n in kind.weight_names:  # checkpoints.official.RULES holds the kind's keys
        assert checkpoints.official_key(getattr(layer, n).path)[0] == kind.checkpoint_keys[n].format(block=block)
        assert positions.is_table(getattr(layer, n).path)
    assert not positions.is_table("encoder_block_0/attention/query_kernel")
    found = [other.name for other in positions.KINDS.values() if other.in_file(other.file_tables(arrays))]
    assert found == ([name] if kind.weight_names else [])
    assert checkpoints.config_from_checkpoint(tmp_path / "m.npz").position_embedding == name
