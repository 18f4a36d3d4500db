"""Official google-research/vision_transformer `.npz` checkpoints, in and out.

The released files hold float32 arrays under `/`-joined Flax paths
(`Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel`).
Our layers keep the official shapes, so every weight maps one to one: the
table `RULES` below pairs each keras_vit weight path with its official key,
and both the reader and the writer use it. Official key names appear nowhere
else in the package.

Kinds the official code does not have (`learned_2d` position tables,
relative attention) are written under keys of the same style, marked
"keras_vit extension" below, so every keras_vit model round-trips through
the format; the official code ignores keys it does not know.
"""

import io
import logging
import math
import os
import re

import numpy as np

from keras_vit.layers import PositionEmbedding, ScannedEncoder
from keras_vit.variants import SIZES, STEMS

# GroupNorm scale and bias are (C,) here and (1, 1, 1, C) in released files.
GROUP_NORM = "group_norm"

# (keras_vit weight path, official key, transform): a regular expression, its
# template, and how the array changes on the way (None: not at all).
RULES = (
    (r"resnet_stem/((?:block\d+/unit\d+/)?conv(?:_root|1|2|3|_proj))/kernel", r"\1/kernel"),
    (r"resnet_stem/((?:block\d+/unit\d+/)?gn(?:_root|1|2|3|_proj))/gamma", r"\1/scale", GROUP_NORM),
    (r"resnet_stem/((?:block\d+/unit\d+/)?gn(?:_root|1|2|3|_proj))/beta", r"\1/bias", GROUP_NORM),
    (r"patch_embedding/(kernel|bias)", r"embedding/\1"),
    (r"class_token/token", "cls"),
    (r"position_embedding/embedding", "Transformer/posembed_input/pos_embedding"),
    # keras_vit extension: learned_2d tables.
    (r"position_embedding/(row|column)_embedding", r"Transformer/posembed_input/\1_embedding"),
    (r"encoder_block_(\d+)/norm_1/gamma", r"Transformer/encoderblock_\1/LayerNorm_0/scale"),
    (r"encoder_block_(\d+)/norm_1/beta", r"Transformer/encoderblock_\1/LayerNorm_0/bias"),
    (
        r"encoder_block_(\d+)/attention/(query|key|value)_(kernel|bias)",
        r"Transformer/encoderblock_\1/MultiHeadDotProductAttention_1/\2/\3",
    ),
    (
        r"encoder_block_(\d+)/attention/output_(kernel|bias)",
        r"Transformer/encoderblock_\1/MultiHeadDotProductAttention_1/out/\2",
    ),
    # keras_vit extension: relative attention tables.
    (
        r"encoder_block_(\d+)/attention/((?:prefix_)?relative_embedding)",
        r"Transformer/encoderblock_\1/MultiHeadDotProductAttention_1/\2",
    ),
    (r"encoder_block_(\d+)/norm_2/gamma", r"Transformer/encoderblock_\1/LayerNorm_2/scale"),
    (r"encoder_block_(\d+)/norm_2/beta", r"Transformer/encoderblock_\1/LayerNorm_2/bias"),
    (r"encoder_block_(\d+)/mlp/dense_1/(kernel|bias)", r"Transformer/encoderblock_\1/MlpBlock_3/Dense_0/\2"),
    (r"encoder_block_(\d+)/mlp/dense_2/(kernel|bias)", r"Transformer/encoderblock_\1/MlpBlock_3/Dense_1/\2"),
    (r"encoder_norm/gamma", "Transformer/encoder_norm/scale"),
    (r"encoder_norm/beta", "Transformer/encoder_norm/bias"),
    (r"pre_logits/(kernel|bias)", r"pre_logits/\1"),
    (r"head/(kernel|bias)", r"head/\1"),
)


def official_key(path):
    """`(key, transform)` of a keras_vit weight path, e.g. `encoder_norm/gamma`."""
    for pattern, template, *transform in RULES:
        match = re.fullmatch(pattern, path)
        if match:
            return match.expand(template), (transform or [None])[0]
    raise ValueError(
        f"The weight {path!r} has no key in the official checkpoint format "
        "nor an extension key of keras_vit"
    )


def _entries(model):
    """`(weight path, variable, block)` for each array `model` has in the format.

    A `ScannedEncoder`'s stacked weight is one entry per block, under the
    path the unrolled model gives it (`encoder_block_3/mlp/dense_1/kernel`),
    with `block` the index on its leading axis; other weights are themselves
    (`block` None).
    """
    scanned = {id(w): layer for layer in model.layers if isinstance(layer, ScannedEncoder) for w in layer.weights}
    for weight in model.weights:
        layer = scanned.get(id(weight))
        if layer is None:
            yield weight.path, weight, None
            continue
        block_path = weight.name.replace(".", "/")
        for block in range(layer.num_layers):
            yield f"encoder_block_{block}/{block_path}", weight, block


def _gfile():
    """`tf.io.gfile` (local, `gs://`, ...), imported on use: the model runs on other Keras backends without TF."""
    import tensorflow as tf

    return tf.io.gfile


def read_npz(path):
    """Reads an official checkpoint from anything `tf.io.gfile` opens."""
    with _gfile().GFile(str(path), "rb") as f:
        with np.load(io.BytesIO(f.read()), allow_pickle=False) as archive:
            return {key: archive[key] for key in archive.files}


def _square_grid(num_patches, key):
    side = math.isqrt(num_patches)
    if side * side != num_patches:
        raise ValueError(
            f"{key} holds {num_patches} patch positions, not a square grid; "
            "pass `source_grid_size=(rows, cols)`"
        )
    return side, side


def describe(arrays):
    """What architecture an official checkpoint holds, read off its shapes.

    Returns a name such as "ViT-B/16" or "R50+ViT-B/16" when the widths and
    depth match a variant of the table, and the raw numbers in any case.
    """
    if "embedding/kernel" not in arrays:
        return "not a ViT checkpoint (it has no 'embedding/kernel')"
    patch, _, _, width = arrays["embedding/kernel"].shape
    blocks = {int(m.group(1)) for k in arrays if (m := re.match(r"Transformer/encoderblock_(\d+)/", k))}
    query = arrays.get("Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel")
    heads = query.shape[1] if query is not None else None
    stages = tuple(
        len({k.split("/")[1] for k in arrays if k.startswith(f"block{i}/")})
        for i in range(1, 5) if f"block{i}/unit1/conv1/kernel" in arrays
    )
    hybrid = "conv_root/kernel" in arrays
    size = next((name for name, s in SIZES.items()
                 if (s.hidden_size, s.num_layers, s.num_heads) == (width, len(blocks), heads)), None)
    name = None
    if size and not hybrid:
        name = f"ViT-{size}/{patch}"
    elif size:
        name = next((f"{key[0]}+ViT-{size}/{key[1]}" for key, s in STEMS.items()
                     if s.resnet_num_layers == stages and s.patch_size == patch), None)
    details = f"hidden {width}, {len(blocks)} blocks, {heads} heads, patch {patch}"
    if hybrid:
        details += f", ResNet stages {stages}"
    head = arrays.get("head/kernel")
    if head is not None:
        details += f", {head.shape[-1]} classes"
    if "pre_logits/kernel" in arrays:
        details += f", pre_logits {arrays['pre_logits/kernel'].shape[-1]}"
    return f"{name} ({details})" if name else f"an unnamed configuration ({details})"


def load_npz(model, path, source_grid_size=None):
    """Loads an official `.npz` checkpoint into a keras_vit model.

    Position embeddings made for another grid are resampled the model's way
    (corner-aligned bilinear by default, the official resize); a head made
    for another number of classes is re-initialised to zeros, as the paper
    fine-tunes.

    Args:
        model: a model from `keras_vit.ViT` or a named builder.
        path: local path, `gs://` path or anything `tf.io.gfile` opens.
        source_grid_size: optional (rows, cols) of the checkpoint's patch
            grid, for non-square grids; square grids are inferred.

    Raises:
        ValueError: listing every missing key, unexpected key and shape
            mismatch (model shape vs file shape) at once.
    """
    arrays = read_npz(path)
    resized = {}  # layer name -> its tables resampled to the model's grid
    values, missing, mismatched = {}, [], []  # values: (variable id, block) -> array
    entries = list(_entries(model))
    for path_in_model, weight, block in entries:
        key, transform = official_key(path_in_model)
        if key not in arrays:
            missing.append(key)
            continue
        value = arrays[key]
        shape = tuple(weight.shape if block is None else weight.shape[1:])
        if transform == GROUP_NORM and value.size == math.prod(shape):
            value = value.reshape(shape)
        if tuple(value.shape) != shape:
            layer_path, name = path_in_model.rsplit("/", 1)
            layer_name = layer_path.split("/")[0]
            if block is not None and name.endswith("relative_embedding"):
                raise ValueError(
                    f"{key} is made for another grid: {value.shape} vs {shape}. Resizing relative "
                    "tables needs the unrolled blocks: load into a model with scan_layers=False, "
                    "save it with save_npz, and load that file"
                )
            if layer_path == "position_embedding" or name.endswith("relative_embedding"):
                if layer_path not in resized:
                    layer = model.get_layer(layer_name)
                    layer = layer if layer_path == layer_name else layer.attention
                    resized[layer_path] = _resize_tables(layer, arrays, source_grid_size)
                value = resized[layer_path][name]
            elif layer_name == "head":
                logging.warning("The checkpoint's head has %s classes; the model's %s-class head is "
                                "re-initialised to zeros", value.shape[-1], shape[-1])
                value = np.zeros(shape, np.float32)
            else:
                mismatched.append(f"{key}: model {shape} vs file {tuple(value.shape)}")
                continue
        values[id(weight), block] = value
    unexpected = set(arrays) - {official_key(path_in_model)[0] for path_in_model, _, _ in entries}
    if not any(layer.name == "head" for layer in model.layers):
        # A model without its top takes the features of a full checkpoint.
        unexpected -= {"head/kernel", "head/bias"}
    unexpected = sorted(unexpected)
    if missing or unexpected or mismatched:
        raise ValueError(
            f"The checkpoint {path} does not fit the model {model.name!r}: it looks like "
            f"{describe(arrays)}.\n"
            f"Missing keys: {missing}\nUnexpected keys: {unexpected}\n"
            f"Shape mismatches: {mismatched}"
        )
    for weight in model.weights:
        if (id(weight), None) in values:
            weight.assign(values[id(weight), None])
        else:  # stacked: one array per block
            weight.assign(np.stack([values[id(weight), b] for b in range(weight.shape[0])]))
    return model


def _resize_tables(layer, arrays, source_grid_size):
    """Resamples a layer's tables in `arrays` to the layer's own grid.

    A twin of `layer` is built at the file's grid (inferred from the table
    shapes, or `source_grid_size` for a non-square `learned_1d` table), takes
    the file's tables, and resamples them with `resized_weights`.
    """
    tables = {w.name: arrays[official_key(w.path)[0]] for w in layer.weights
              if w.name.endswith("embedding")}
    prefix = layer.num_prefix_tokens
    config = layer.get_config()
    if isinstance(layer, PositionEmbedding) and layer.kind == "learned_2d":
        grid = (len(tables["row_embedding"]), len(tables["column_embedding"]))
    elif isinstance(layer, PositionEmbedding):
        grid = source_grid_size or _square_grid(tables["embedding"].shape[1] - prefix, "pos_embedding")
    elif layer.relative_position == "relative_2d":
        grid = tuple((n + 1) // 2 for n in tables["relative_embedding"].shape[:2])
    else:  # 1-D relative: only the sequence length matters
        grid = (1, (len(tables["relative_embedding"]) + 1) // 2 - prefix)
    config.update(grid_size=grid, name=f"{layer.name}_source")
    source = type(layer).from_config(config)
    width = arrays["embedding/bias"].shape[-1]  # the model width
    if isinstance(layer, PositionEmbedding):
        source.build((None, *grid, width))
    else:
        source.build((None, None, width))
    for weight in source.weights:
        if weight.name in tables:
            weight.assign(tables[weight.name])
    logging.info("%s resized from grid %s to %s", layer.name, grid, layer.grid_size)
    return source.resized_weights(layer.grid_size)


def save_npz(model, path):
    """Writes `model`'s weights as an official `.npz` checkpoint.

    The file is written under a temporary name and renamed when complete,
    so a crash never leaves a half-written checkpoint under `path`.
    """
    arrays, numpy = {}, {}
    for path_in_model, weight, block in _entries(model):
        key, transform = official_key(path_in_model)
        if id(weight) not in numpy:
            numpy[id(weight)] = np.asarray(weight.numpy(), np.float32)
        value = numpy[id(weight)] if block is None else numpy[id(weight)][block]
        arrays[key] = value.reshape(1, 1, 1, -1) if transform == GROUP_NORM else value
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    path, gfile = str(path), _gfile()
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with gfile.GFile(tmp, "wb") as f:
            f.write(buffer.getvalue())
        gfile.rename(tmp, path, overwrite=True)
    finally:
        if gfile.exists(tmp):
            gfile.remove(tmp)
    return path
