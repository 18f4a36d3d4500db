"""Official google-research/vision_transformer `.npz` checkpoints, in and out.

The released files hold float32 arrays under `/`-joined Flax paths
(`Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel`).
Our layers keep the official shapes, so every weight maps one to one: the
table `RULES` below pairs each keras_vit weight path with its official key,
and both the reader and the writer use it. Position tables take their rows
from their kind's module (`keras_vit.positions`), which owns its keys;
official key names appear nowhere else in the package (and in
`keras_vit.timm_format`, which maps timm's names to them).

Kinds the official code does not have (`learned_2d` position tables,
relative attention, timm's `fc_norm`, the stored `ViTConfig`) are written
under keys of the same style, marked "keras_vit extension", so every
keras_vit model round-trips through the format; the official code ignores
keys it does not know. `official_config` reads a file's `ViTConfig` back.
"""

import io
import json
import logging
import math
import os
import re
import zipfile
import zlib

import numpy as np

from keras_vit import positions
from keras_vit.config import TRAINING_FIELDS, ViTConfig, differing_conventions
from keras_vit.layers import PositionEmbedding, ScannedEncoder
from keras_vit.layers.resnet_stem import output_stride
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
    # keras_vit extension: DeiT's distillation token and its head.
    (r"distillation_token/token", "dist"),
    (r"head_dist/(kernel|bias)", r"head_dist/\1"),
    # Position tables (official pos_embedding; keras_vit extension: learned_2d and relative tables): each kind's own keys.
    *positions.checkpoint_rules(),
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
    (r"encoder_block_(\d+)/norm_2/gamma", r"Transformer/encoderblock_\1/LayerNorm_2/scale"),
    (r"encoder_block_(\d+)/norm_2/beta", r"Transformer/encoderblock_\1/LayerNorm_2/bias"),
    (r"encoder_block_(\d+)/mlp/dense_1/(kernel|bias)", r"Transformer/encoderblock_\1/MlpBlock_3/Dense_0/\2"),
    (r"encoder_block_(\d+)/mlp/dense_2/(kernel|bias)", r"Transformer/encoderblock_\1/MlpBlock_3/Dense_1/\2"),
    (r"encoder_norm/gamma", "Transformer/encoder_norm/scale"),
    (r"encoder_norm/beta", "Transformer/encoder_norm/bias"),
    # keras_vit extension: timm's LayerNorm after pooling.
    (r"fc_norm/gamma", "fc_norm/scale"),
    (r"fc_norm/beta", "fc_norm/bias"),
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
    """Reads an official checkpoint from anything `tf.io.gfile` opens.

    Raises:
        ValueError: naming the file, when it is not a whole `.npz` of arrays.
    """
    with _gfile().GFile(str(path), "rb") as f:
        data = f.read()
    try:
        archive = np.load(io.BytesIO(data), allow_pickle=False)
        if isinstance(archive, np.lib.npyio.NpzFile):
            with archive:
                return {key: archive[key] for key in archive.files}
        problem = f"it holds one {type(archive).__name__}, not named arrays"
    except (ValueError, EOFError, OSError, zipfile.BadZipFile, zlib.error) as error:  # np.load on bad bytes
        problem = f"{type(error).__name__}: {error}"
    raise ValueError(f"{path} is not a whole .npz checkpoint (a zip of numpy arrays; {len(data)} bytes): {problem}. "
                     "If it was downloaded, the download may have been cut short: delete it and fetch it again")


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


def is_weights_file(weights):
    """Whether `weights` names a file (or hub directory) rather than named pretrained weights."""
    text = str(weights)
    return text.endswith((".npz", ".safetensors", ".weights.h5")) or os.path.isdir(text)


def checkpoint_stem(path):
    """A model name from a checkpoint's file name: "ViT-B_16.npz" -> "ViT-B_16"."""
    stem = os.path.basename(str(path).rstrip("/"))
    return re.sub(r"\W", "_", stem.rsplit(".", 1)[0] if "." in stem else stem)


def _local_file(path):
    """`path` as a local name, an official file's URL fetched once into the Keras cache; its format checked."""
    text = str(path)
    if text.endswith(".npz") and text.startswith(("http://", "https://")):
        from keras_vit import pretrained

        return pretrained.fetch(text)
    if not (text.endswith((".npz", ".safetensors")) or os.path.isdir(text)):
        raise ValueError(
            "A checkpoint must be an official '.npz' (path or URL), a timm / Hugging Face '.safetensors' file "
            f"or a Hugging Face model directory; received {text!r}"
        )
    return text


def read_checkpoint(path, image_size=None, num_heads=None):
    """`(ViTConfig, arrays)`: any supported checkpoint, its arrays under official keys.

    `.npz`: an official file (local, `gs://`, or `https://`) or one keras_vit
    wrote; `.safetensors` or a directory: timm / Hugging Face
    (`keras_vit.timm_format`). `image_size` gives the grid of a non-square
    official table; `num_heads` that of a timm file without `config.json`.
    """
    text = _local_file(path)
    if not text.endswith(".npz"):
        from keras_vit import timm_format

        return timm_format.read(text, num_heads=num_heads, image_size=image_size)
    arrays = read_npz(text)
    return official_config(arrays, text, image_size), arrays


def config_from_checkpoint(path, **overrides):
    """The `ViTConfig` a checkpoint holds, read from the file alone.

    Official `.npz` files: every released kind (class token or GAP,
    `pre_logits`, 1-D/2-D/relative position tables, hybrids, headless); files
    keras_vit wrote carry their whole configuration. timm / Hugging Face
    `.safetensors`: `config.json` when present, else the weight shapes.

    Raises:
        ValueError: naming the file, what was expected and what was found.
    """
    config, _ = read_checkpoint(path, overrides.get("image_size"), overrides.get("num_heads"))
    return config.replace(**overrides)


def load_checkpoint(model, path, source_grid_size=None):
    """Loads any supported checkpoint (see `read_checkpoint`) into `model`."""
    text = _local_file(path)
    if text.endswith(".npz"):
        return load_arrays(model, read_npz(text), text, source_grid_size)
    from keras_vit import timm_format

    config = getattr(model, "vit_config", None)
    stated, arrays = timm_format.read(text, num_heads=config and config.num_heads,
                                      image_size=config and config.image_size)
    # A bare .safetensors states nothing: its config was read off shapes with the model's help.
    return load_arrays(model, arrays, text, source_grid_size, stated=stated if timm_format.has_config(text) else None)


# The classification heads: restarted at zero when the file's do not fit (or it has none).
HEADS = ("head", "head_dist")
# keras_vit extension: the writer's whole ViTConfig as JSON (a 0-d string array).
CONFIG_KEY = "keras_vit/config"
_BLOCK = "Transformer/encoderblock_{}/"
_ATTENTION = _BLOCK + "MultiHeadDotProductAttention_1/"


def official_config(arrays, source, image_size=None):
    """The `ViTConfig` of official-format `arrays`: the stored one, else read off the shapes.

    `image_size` replaces the size read off the position tables (needed for a non-square `learned_1d` grid).
    """
    if CONFIG_KEY in arrays:
        return stored_config(arrays)
    for key in ("embedding/kernel", _ATTENTION.format(0) + "query/kernel", _BLOCK.format(0) + "MlpBlock_3/Dense_0/kernel"):
        if key not in arrays:
            raise ValueError(f"{source} is not a ViT checkpoint in the official format: it has no {key!r} "
                             f"(found {len(arrays)} arrays, e.g. {sorted(arrays)[:5]})")
    patch_h, patch_w, _, width = arrays["embedding/kernel"].shape
    fields = dict(
        patch_size=(patch_h, patch_w),
        hidden_size=width,
        num_heads=arrays[_ATTENTION.format(0) + "query/kernel"].shape[1],
        mlp_dim=arrays[_BLOCK.format(0) + "MlpBlock_3/Dense_0/kernel"].shape[-1],
        num_layers=len({m.group(1) for k in arrays if (m := re.match(r"Transformer/encoderblock_(\d+)/", k))}),
        class_token="cls" in arrays,
        distilled="dist" in arrays,
        classifier="token" if "cls" in arrays else "gap",
        classes=arrays["head/kernel"].shape[-1] if "head/kernel" in arrays else 0,
        representation_size=arrays["pre_logits/kernel"].shape[-1] if "pre_logits/kernel" in arrays else None,
        **_official_stem(arrays),
    )
    fields["channels"] = (arrays["conv_root/kernel"] if "conv_root/kernel" in arrays else arrays["embedding/kernel"]).shape[2]
    fields["position_embedding"], grid = _official_positions(arrays, fields["class_token"] + fields["distilled"], source,
                                                               image_size)
    stride = output_stride(fields["resnet_num_layers"]) if "resnet_num_layers" in fields else 1
    image_size = image_size or (grid[0] * patch_h * stride, grid[1] * patch_w * stride)
    return ViTConfig(**fields, image_size=image_size)


def stored_config(arrays):
    """The `ViTConfig` a file keras_vit wrote stores (None in other files)."""
    return ViTConfig.from_dict(json.loads(str(arrays[CONFIG_KEY]))) if CONFIG_KEY in arrays else None


def _official_stem(arrays):
    """A hybrid's ResNet fields read off its units and root width; {} without a stem."""
    if "conv_root/kernel" not in arrays:
        return {}
    stages = tuple(len({k.split("/")[1] for k in arrays if k.startswith(f"block{i}/")})
                   for i in range(1, 5) if f"block{i}/unit1/conv1/kernel" in arrays)
    return dict(resnet_num_layers=stages, resnet_width_factor=arrays["conv_root/kernel"].shape[-1] / 64)


def _official_positions(arrays, prefix_rows, source, image_size):
    """`(kind, grid)`: the position embedding whose tables the file holds, and the patch grid they are made for."""
    for kind in positions.KINDS.values():
        tables = kind.file_tables(arrays)
        if kind.in_file(tables):
            return kind.name, None if image_size else kind.file_grid(tables, prefix_rows, source)
    weightless = " or ".join(repr(name) for name, kind in positions.KINDS.items() if not kind.weight_names)
    raise ValueError(
        f"{source} has no position table: it was made with position_embedding {weightless}, which "
        "hold no weights, and a file not written by keras_vit does not say which. Pass "
        f"position_embedding={weightless} (and image_size) to ViT(...) with weights=this file"
    )


def load_npz(model, path, source_grid_size=None):
    """Loads an official `.npz` checkpoint into a keras_vit model (`load_arrays`)."""
    return load_arrays(model, read_npz(path), str(path), source_grid_size)


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
        ValueError: naming the computed fields the file states otherwise, or
            listing every missing key, unexpected key and shape mismatch
            (model shape vs file shape) at once.
    """
    stated = stated or stored_config(arrays)
    if stated is not None:
        _check_stated(model, stated, source, overridden)
        source_grid_size = source_grid_size or stated.grid_size
    described = describe(arrays)
    arrays = _drop_unused_top(model, arrays)
    entries = list(_entries(model))
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
    return model


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
        # The head read pre_logits' output, so it restarts too (the official fine-tuning).
        logging.info("The checkpoint's pre_logits layer and head are dropped: the model has no pre_logits")
        drop |= {"pre_logits/kernel", "pre_logits/bias"} | heads
    return {key: value for key, value in arrays.items() if key not in drop}


def _fit(model, arrays, key, transform, path_in_model, shape, block, resized, source_grid_size):
    """The file's array for one model weight, made to `shape`; None when it cannot fit."""
    layer_path, name = path_in_model.rsplit("/", 1)
    layer_name = layer_path.split("/")[0]
    if layer_name in HEADS and (key not in arrays or tuple(arrays[key].shape) != shape):
        found = "no head" if key not in arrays else f"a head {key} of shape {arrays[key].shape}"
        logging.warning("The checkpoint has %s; the model's head (%s) is re-initialised to zeros", found, shape)
        return np.zeros(shape, np.float32)
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


def _config_not_in_shapes(config, arrays):
    """Whether `config` must be stored: the shapes of `arrays` alone would be read as another one.

    Official kinds are read back from their shapes, so their files keep exactly the official keys.
    """
    if config is None:
        return False
    try:
        inferred = official_config(arrays, "the model's arrays")
    except ValueError:  # sincos_2d or none, a non-square grid
        return True
    return inferred.replace(**{name: getattr(config, name) for name in TRAINING_FIELDS}) != config


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
    if _config_not_in_shapes(getattr(model, "vit_config", None), arrays):
        arrays[CONFIG_KEY] = np.array(json.dumps(model.vit_config.to_dict(), sort_keys=True))
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
