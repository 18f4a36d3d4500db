"""Putting checkpoint arrays (under official keys) into a keras_vit model: every format's one loader.

Each format module converts its file to the official `.npz` keys
(`keras_vit.checkpoints.official.RULES`); this module checks the arrays
against the model, resizes position tables to its grid, restarts heads that
do not fit, and assigns, the same way for every format.
"""

import logging
import math

import numpy as np

from keras_vit import positions
from keras_vit.checkpoints import official
from keras_vit.checkpoints.official import CONFIG_KEY, GROUP_NORM, describe, official_key, stored_config
from keras_vit.config import differing_conventions
from keras_vit.layers import PositionEmbedding

# The classification heads: restarted at zero when the file's do not fit (or it has none).
HEADS = ("head", "head_dist")


def load_arrays(model, arrays, source, source_grid_size=None, stated=None, overridden=()):
    """Loads checkpoint `arrays` (official keys) into a keras_vit model.

    Position embeddings made for another grid are resampled the model's way
    (corner-aligned bilinear by default, the official resize). As the
    official fine-tuning code: a head for another number of classes, or one
    the file lacks, is re-initialised to zeros; a `pre_logits` layer the
    model lacks is dropped, and the head trained on its output with it.

    Args:
        model: a model from `keras_vit.ViT` or a named builder.
        arrays: dict of official key -> array (`read_checkpoint`).
        source: the file's name, for messages.
        source_grid_size: optional (rows, cols) of the checkpoint's patch
            grid, for non-square grids; a file's stated grid and square grids
            are known without it.
        stated: the `ViTConfig` the file states (a timm `config.json`); a
            file keras_vit wrote states its own. Its `CONVENTION_FIELDS` must
            be the model's (shapes are checked for the others).
        overridden: fields the caller chose to differ from the file's.

    Raises:
        ValueError: naming the arrays that hold NaN or infinite values, the
            computed fields the file states otherwise, or
            listing every missing key, unexpected key and shape mismatch
            (model shape vs file shape) at once.
    """
    stated = stated or stored_config(arrays)
    if stated is not None:
        _check_stated(model, stated, source, overridden)
        source_grid_size = source_grid_size or stated.grid_size
    described = describe(arrays)
    dropped_pre_logits = "pre_logits/kernel" in arrays and "pre_logits" not in {layer.name for layer in model.layers}
    arrays = _drop_unused_top(model, arrays)
    bad = official.non_finite_keys(arrays)
    if bad:
        raise ValueError(official.non_finite_message(bad, f"The checkpoint {source}") + "; nothing was loaded")
    entries = list(official.entries(model))
    values, missing, mismatched = {}, [], []  # values: (variable id, block) -> array
    resized = {}  # layer path -> its tables resampled to the model's grid
    for path_in_model, weight, block in entries:
        key, transform = official_key(path_in_model)
        if key not in arrays and path_in_model.split("/")[0] not in HEADS:
            missing.append(key)
            continue
        shape = tuple(weight.shape if block is None else weight.shape[1:])
        value = _fit(model, arrays, key, transform, path_in_model, shape, block, resized, source_grid_size)
        if value is None:
            mismatched.append(f"{key}: model {shape} vs file {tuple(arrays[key].shape)}")
        else:
            values[id(weight), block] = value
    unexpected = sorted(set(arrays) - {official_key(p)[0] for p, _, _ in entries} - {CONFIG_KEY})
    if missing or unexpected or mismatched:
        raise ValueError(
            f"The checkpoint {source} does not fit the model {model.name!r}: it looks like "
            f"{described}.\n"
            f"Missing keys: {missing}\nUnexpected keys: {unexpected}\n"
            f"Shape mismatches: {mismatched}"
        )
    _assign(model, values)
    _say_restarted_heads(model, arrays, dropped_pre_logits, source)
    return model


def _say_restarted_heads(model, arrays, dropped_pre_logits, source):
    """One warning saying which heads start at zero and why (the official fine-tuning rule), if any do."""
    names = {layer.name for layer in model.layers}
    restarted = [f"{head} {tuple(model.get_layer(head).kernel.shape)}" for head in HEADS if head in names
                 and tuple(arrays.get(f"{head}/kernel", np.empty(0)).shape)
                 != tuple(model.get_layer(head).kernel.shape)]
    if not restarted:
        return
    if dropped_pre_logits:
        why = "its pre_logits layer and the head that read it are dropped (the model has no pre_logits)"
    elif "head/kernel" in arrays:
        why = f"its head {tuple(arrays['head/kernel'].shape)} does not fit the model's"
    else:
        why = "it has no head"
    logging.warning("Loading %s: %s, so the model's %s start%s at zero", source, why, " and ".join(restarted),
                    "s" if len(restarted) == 1 else "")


def _check_stated(model, stated, source, overridden):
    config = getattr(model, "vit_config", None)
    if config is None:  # a model loaded from a .keras file written before models carried their ViTConfig
        return
    differ = [f"{name}: model {getattr(config, name)!r}, file {getattr(stated, name)!r}"
              for name in differing_conventions(config, stated) if name not in overridden]
    if differ:
        raise ValueError(
            f"The checkpoint {source} states a model that computes otherwise than {model.name!r}: "
            f"{'; '.join(differ)}. Build the model from the file, `keras_vit.ViT.from_checkpoint(path)` "
            "(whose keyword arguments override fields on purpose), or give the model the file's values")


def _drop_unused_top(model, arrays):
    """`arrays` without the head a headless model lacks and the pre_logits a model without them lacks."""
    names = {layer.name for layer in model.layers}
    heads = {f"{head}/{kind}" for head in HEADS for kind in ("kernel", "bias")}
    drop = set()
    if "head" not in names:  # a model without its top takes the features of a full checkpoint
        drop |= heads
    if "pre_logits" not in names and "pre_logits/kernel" in arrays:
        # The head read pre_logits' output, so it restarts too (the official fine-tuning; said once by the caller).
        drop |= {"pre_logits/kernel", "pre_logits/bias"} | heads
    return {key: value for key, value in arrays.items() if key not in drop}


def _fit(model, arrays, key, transform, path_in_model, shape, block, resized, source_grid_size):
    """The file's array for one model weight, made to `shape`; None when it cannot fit."""
    layer_path, name = path_in_model.rsplit("/", 1)
    layer_name = layer_path.split("/")[0]
    if layer_name in HEADS and (key not in arrays or tuple(arrays[key].shape) != shape):
        return np.zeros(shape, np.float32)  # said once, by _say_restarted_heads
    value = arrays[key]
    if transform == GROUP_NORM and value.size == math.prod(shape):
        value = value.reshape(shape)
    table = positions.is_table(path_in_model)
    # A known grid decides, not the shape: a (2, 8) table has as many rows as a (4, 4) one.
    regrid = table and source_grid_size and tuple(source_grid_size) != _table_grid(model, layer_path, block)
    if tuple(value.shape) == shape and not regrid:
        return value
    if not table:
        return None  # only position tables resize to another grid
    if block is not None:
        raise ValueError(
            f"{key} is made for another grid: {value.shape} vs {shape}. Resizing relative "
            "tables needs the unrolled blocks: load into a model with scan_layers=False, "
            "save it with save_npz, and load that file"
        )
    if layer_path not in resized:
        resized[layer_path] = _resize_tables(_table_layer(model, layer_path), arrays, source_grid_size)
    value = resized[layer_path][name]
    return value if tuple(value.shape) == shape else None  # e.g. another width


def _table_grid(model, layer_path, block):
    """The grid the model's tables at `layer_path` are made for (a scanned encoder's: the model's)."""
    return tuple(model.vit_config.grid_size) if block is not None else _table_layer(model, layer_path).grid_size


def _table_layer(model, layer_path):
    """The layer holding position tables at `layer_path`: a `PositionEmbedding` or a block's attention."""
    layer = model.get_layer(layer_path.split("/")[0])
    return layer if "/" not in layer_path else layer.attention


def _assign(model, values):
    for weight in model.weights:
        if (id(weight), None) in values:
            weight.assign(values[id(weight), None])
        else:  # stacked: one array per block
            weight.assign(np.stack([values[id(weight), b] for b in range(weight.shape[0])]))


def _resize_tables(layer, arrays, source_grid_size):
    """The file's tables for `layer` (a `PositionEmbedding` or an attention) resampled to the layer's grid.

    The layer's kind resamples them in float64 from the grid it reads off
    their shapes (or `source_grid_size`, for a non-square `learned_1d` table).
    """
    kind = layer.position
    # float32 first: the tables are the float32 weights they would be loaded into.
    tables = {w.name: np.asarray(arrays[official_key(w.path)[0]], np.float32).astype(np.float64)
              for w in layer.weights if w.name in kind.weight_names}
    prefix = layer.prefix_rows if isinstance(layer, PositionEmbedding) else layer.num_prefix_tokens
    resized = kind.resize(tables, layer.grid_size, prefix, layer.interpolation, source_grid_size)
    for name, table in resized.items():
        logging.info("%s/%s resized from %s to %s", layer.name, name, tables[name].shape, table.shape)
    return resized
