"""Official google-research/vision_transformer `.npz` checkpoints, in and out.

The released files hold float32 arrays under `/`-joined Flax paths
(`Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel`).
Our layers keep the official shapes, so every weight maps one to one: the
table `RULES` below pairs each keras_vit weight path with its official key,
and both the reader and the writer use it. Position tables take their rows
from their kind's module (`keras_vit.positions`), which owns its keys;
official key names appear nowhere else in the package (and in
`keras_vit.checkpoints.timm`, which maps timm's names to them). The other
formats convert their files to these keys, so one loader
(`keras_vit.checkpoints.loading`) serves them all.

Kinds the official code does not have (`learned_2d` position tables,
relative attention, timm's `fc_norm`, LayerScale, q/k, patch, attention
output and MLP norms, RoPE-Mixed's frequencies, a projection, the stored
`ViTConfig`) are written under keys of the same
style, marked "keras_vit extension", so every keras_vit model round-trips
through the format; the official code ignores keys it does not know. `official_config` reads a file's `ViTConfig` back;
`describe` names what a file holds for error messages, with the same reading.
"""

import dataclasses
import io
import json
import re
import zipfile
import zlib

import numpy as np

from keras_vit import positions
from keras_vit.checkpoints import files
from keras_vit.checkpoints.pretrained import model_name
from keras_vit.config import TRAINING_FIELDS, ViTConfig, output_stride
from keras_vit.layers import ScannedEncoder
from keras_vit.variants import variant_name

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
    # keras_vit extension: register tokens (timm's reg_token).
    (r"register_tokens/tokens", "reg"),
    # big_vision's MAP head, under its keys.
    (r"map_head/probe", "MAPHead_0/probe"),
    (r"map_head/(query|key|value)_(kernel|bias)", r"MAPHead_0/MultiHeadDotProductAttention_0/\1/\2"),
    (r"map_head/output_(kernel|bias)", r"MAPHead_0/MultiHeadDotProductAttention_0/out/\1"),
    (r"map_head/norm/gamma", "MAPHead_0/LayerNorm_0/scale"),
    (r"map_head/norm/beta", "MAPHead_0/LayerNorm_0/bias"),
    (r"map_head/mlp/dense_1/(kernel|bias)", r"MAPHead_0/MlpBlock_0/Dense_0/\1"),
    (r"map_head/mlp/dense_2/(kernel|bias)", r"MAPHead_0/MlpBlock_0/Dense_1/\1"),
    # Position tables (official pos_embedding; keras_vit extension: learned_2d and relative tables): each kind's
    # own keys.
    *positions.checkpoint_rules(),
    # A LayerNorm's gamma and an RMSNorm's scale are both Flax's `scale`; the file's ViTConfig says which norm.
    (r"encoder_block_(\d+)/norm_1/(?:gamma|scale)", r"Transformer/encoderblock_\1/LayerNorm_0/scale"),
    (r"encoder_block_(\d+)/norm_1/beta", r"Transformer/encoderblock_\1/LayerNorm_0/bias"),
    (
        r"encoder_block_(\d+)/attention/(query|key|value)_(kernel|bias)",
        r"Transformer/encoderblock_\1/MultiHeadDotProductAttention_1/\2/\3",
    ),
    (
        r"encoder_block_(\d+)/attention/output_(kernel|bias)",
        r"Transformer/encoderblock_\1/MultiHeadDotProductAttention_1/out/\2",
    ),
    (r"encoder_block_(\d+)/norm_2/(?:gamma|scale)", r"Transformer/encoderblock_\1/LayerNorm_2/scale"),
    (r"encoder_block_(\d+)/norm_2/beta", r"Transformer/encoderblock_\1/LayerNorm_2/bias"),
    (r"encoder_block_(\d+)/mlp/dense_1/(kernel|bias)", r"Transformer/encoderblock_\1/MlpBlock_3/Dense_0/\2"),
    (r"encoder_block_(\d+)/mlp/dense_2/(kernel|bias)", r"Transformer/encoderblock_\1/MlpBlock_3/Dense_1/\2"),
    (r"encoder_norm/(?:gamma|scale)", "Transformer/encoder_norm/scale"),
    (r"encoder_norm/beta", "Transformer/encoder_norm/bias"),
    # keras_vit extension: timm's LayerNorm after pooling.
    (r"fc_norm/(?:gamma|scale)", "fc_norm/scale"),
    (r"fc_norm/beta", "fc_norm/bias"),
    # keras_vit extension: the blocks of the later families (issue 50), each weight under a key of its own.
    (r"encoder_block_(\d+)/layer_scale_([12])/gamma", r"Transformer/encoderblock_\1/LayerScale_\2/scale"),
    (r"encoder_block_(\d+)/attention/(query|key)_norm/(?:gamma|scale)",
     r"Transformer/encoderblock_\1/MultiHeadDotProductAttention_1/\2_norm/scale"),
    (r"encoder_block_(\d+)/attention/(query|key)_norm/beta",
     r"Transformer/encoderblock_\1/MultiHeadDotProductAttention_1/\2_norm/bias"),
    # keras_vit extension: EVA02's norms inside attention and the MLP, RoPE-Mixed's frequencies (issue 51).
    (r"encoder_block_(\d+)/attention/output_norm/(?:gamma|scale)",
     r"Transformer/encoderblock_\1/MultiHeadDotProductAttention_1/out_norm/scale"),
    (r"encoder_block_(\d+)/attention/output_norm/beta",
     r"Transformer/encoderblock_\1/MultiHeadDotProductAttention_1/out_norm/bias"),
    (r"encoder_block_(\d+)/mlp/norm/(?:gamma|scale)", r"Transformer/encoderblock_\1/MlpBlock_3/norm/scale"),
    (r"encoder_block_(\d+)/mlp/norm/beta", r"Transformer/encoderblock_\1/MlpBlock_3/norm/bias"),
    (r"encoder_block_(\d+)/attention/rope_frequencies",
     r"Transformer/encoderblock_\1/MultiHeadDotProductAttention_1/rope_frequencies"),
    (r"norm_pre/(?:gamma|scale)", "Transformer/norm_pre/scale"),
    (r"norm_pre/beta", "Transformer/norm_pre/bias"),
    (r"patch_norm/(?:gamma|scale)", "embedding_norm/scale"),
    (r"patch_norm/beta", "embedding_norm/bias"),
    (r"projection/kernel", "projection/kernel"),
    (r"pre_logits/(kernel|bias)", r"pre_logits/\1"),
    (r"head/(kernel|bias)", r"head/\1"),
)


# What `read_checkpoint` and `load_checkpoint` accept in this format (`keras_vit.checkpoints.FORMATS`).
DESCRIPTION = "an official '.npz' (path or URL)"
# keras_vit extension: the writer's whole ViTConfig as JSON (a 0-d string array).
CONFIG_KEY = "keras_vit/config"
_BLOCK = "Transformer/encoderblock_{}/"
_ATTENTION = _BLOCK + "MultiHeadDotProductAttention_1/"
# The arrays an encoder's fields are read off; a file without one of them is no ViT checkpoint.
_REQUIRED = ("embedding/kernel", _ATTENTION.format(0) + "query/kernel", _BLOCK.format(0) + "MlpBlock_3/Dense_0/kernel")


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


def entries(model):
    """`(weight path, variable, block)` for each array `model` has in the format.

    A `ScannedEncoder`'s stacked weight is one entry per block, under the
    path the unrolled model gives it (`ScannedEncoder.unrolled_weights`),
    with `block` the index on its leading axis; other weights are themselves
    (`block` None).
    """
    stacked = {}
    for layer in model.layers:
        if isinstance(layer, ScannedEncoder):
            for entry in layer.unrolled_weights():
                stacked.setdefault(id(entry[1]), []).append(entry)
    for weight in model.weights:
        yield from stacked.get(id(weight), [(weight.path, weight, None)])


# --------------------------------------------------------------- the format's registry entry
def matches(path):
    """Whether `path` is a file of this format: an `.npz` (local, `gs://`, or fetched from a URL)."""
    return str(path).endswith(".npz")


def read(path, image_size=None, num_heads=None):
    """`(ViTConfig, arrays)` of an official file; `image_size` gives the grid of a non-square table.

    `num_heads` is read off the attention kernels: the argument is the registry's common signature.
    """
    arrays = read_npz(path)
    return official_config(arrays, str(path), image_size), arrays


def read_arrays(path, config=None):
    """`(stated ViTConfig or None, arrays)`: a file keras_vit wrote states its configuration, released ones none.

    `config` (the model's) is not needed: the arrays are under official keys as they are.
    """
    arrays = read_npz(path)
    return stored_config(arrays), arrays


# --------------------------------------------------------------------- reading
def read_npz(path):
    """Reads an official checkpoint: a local file, or a `gs://`-style URL (through TensorFlow).

    Raises:
        ValueError: naming the file, when it is not a whole `.npz` of arrays.
    """
    data = files.read_bytes(path)
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


def official_config(arrays, source, image_size=None):
    """The `ViTConfig` of official-format `arrays`: the stored one, else read off the shapes.

    `image_size` replaces the size read off the position tables (needed for a non-square `learned_1d` grid).
    """
    if CONFIG_KEY in arrays:
        return stored_config(arrays)
    fields = _encoder_fields(arrays, source)
    prefix = fields["class_token"] + fields["distilled"] + fields["num_register_tokens"]
    fields["position_embedding"], grid = _official_positions(arrays, prefix, source, image_size)
    patch_h, patch_w = fields["patch_size"]
    stride = output_stride(fields["resnet_num_layers"]) if "resnet_num_layers" in fields else 1
    image_size = image_size or (grid[0] * patch_h * stride, grid[1] * patch_w * stride)
    return ViTConfig(**fields, image_size=image_size)


def stored_config(arrays):
    """The `ViTConfig` a file keras_vit wrote stores (None in other files)."""
    return ViTConfig.from_dict(json.loads(str(arrays[CONFIG_KEY]))) if CONFIG_KEY in arrays else None


def _encoder_fields(arrays, source):
    """The `ViTConfig` fields the shapes give, all but the position embedding and the image size."""
    for key in _REQUIRED:
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
        classifier="map" if "MAPHead_0/probe" in arrays else "token" if "cls" in arrays else "gap",
        num_register_tokens=arrays["reg"].shape[1] if "reg" in arrays else 0,
        classes=arrays["head/kernel"].shape[-1] if "head/kernel" in arrays else 0,
        representation_size=arrays["pre_logits/kernel"].shape[-1] if "pre_logits/kernel" in arrays else None,
        **_official_stem(arrays),
    )
    fields["channels"] = arrays["conv_root/kernel" if "conv_root/kernel" in arrays else "embedding/kernel"].shape[2]
    return fields


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


def describe(arrays):
    """What architecture an official checkpoint holds, read off its shapes as `official_config` reads them.

    Returns a name such as "ViT-B/16" or "R50+ViT-B/16" when the encoder is a
    variant of `keras_vit.variants` (`variant_name` decides), and the raw
    numbers in any case.
    """
    missing = [key for key in _REQUIRED if key not in arrays]
    if missing:
        return f"not a ViT checkpoint (it has no {missing[0]!r})"
    stored = stored_config(arrays)
    fields = dataclasses.asdict(stored) if stored else _encoder_fields(arrays, "the file")
    patch_h, patch_w = fields["patch_size"]
    details = (f"hidden {fields['hidden_size']}, {fields['num_layers']} blocks, {fields['num_heads']} heads, "
               f"patch {patch_h if patch_h == patch_w else f'{patch_h}x{patch_w}'}")
    if fields.get("resnet_num_layers") is not None:
        details += f", ResNet stages {tuple(fields['resnet_num_layers'])}"
    if fields["classes"]:
        details += f", {fields['classes']} classes"
    if fields["representation_size"]:
        details += f", pre_logits {fields['representation_size']}"
    name = variant_name(stored) if stored else _variant(fields)
    return f"{model_name(name)} ({details})" if name else f"an unnamed configuration ({details})"


def _variant(fields):
    """The variant name of the encoder `fields` describe, or None (also for fields no `ViTConfig` takes)."""
    encoder = {name: fields[name] for name in ("patch_size", "hidden_size", "mlp_dim", "num_heads", "num_layers",
                                                "resnet_num_layers", "resnet_width_factor") if name in fields}
    stride = output_stride(encoder["resnet_num_layers"]) if encoder.get("resnet_num_layers") is not None else 1
    try:  # one patch per image: any patch size is a valid image size then
        config = ViTConfig(**encoder, image_size=tuple(p * stride for p in encoder["patch_size"]))
    except ValueError:
        return None
    return variant_name(config)


# --------------------------------------------------------------------- writing
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


def non_finite_keys(arrays):
    """The keys of the numeric arrays in `arrays` that hold NaN or an infinity, in order."""
    return [key for key, value in arrays.items()
            if np.asarray(value).dtype.kind in "fc" and not np.isfinite(value).all()]


def non_finite_message(keys, what):
    """`what` holds NaN or infinite values in `keys`: what `load_arrays` and `save_npz` refuse with."""
    return (f"{what} holds NaN or infinite values in {len(keys)} array(s): {keys[:5]}"
            f"{' ...' if len(keys) > 5 else ''}. A model with them predicts NaN or one class for every "
            "image; a diverged run's weights usually look like this")


def save_npz(model, path):
    """Writes `model`'s weights as an official `.npz` checkpoint (a local file, or a `gs://`-style URL).

    The file is written under a temporary name and renamed when complete,
    so a crash never leaves a half-written checkpoint under `path`. Weights
    with NaN or infinite values raise ValueError naming them; nothing is written.
    """
    arrays, numpy = {}, {}
    for path_in_model, weight, block in entries(model):
        key, transform = official_key(path_in_model)
        if id(weight) not in numpy:
            numpy[id(weight)] = np.asarray(weight.numpy(), np.float32)
        value = numpy[id(weight)] if block is None else numpy[id(weight)][block]
        arrays[key] = value.reshape(1, 1, 1, -1) if transform == GROUP_NORM else value
    bad = non_finite_keys(arrays)
    if bad:
        raise ValueError(non_finite_message(bad, f"The model {model.name!r}") + f"; nothing was written to {path}")
    if _config_not_in_shapes(getattr(model, "vit_config", None), arrays):
        arrays[CONFIG_KEY] = np.array(json.dumps(model.vit_config.to_dict(), sort_keys=True))
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return files.write_bytes(path, buffer.getvalue())
