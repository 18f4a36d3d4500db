"""big_vision `.npz` ViT checkpoints (`big_vision/models/vit.py`), read into official keys.

big_vision's ViT (the `howto-i21k` and `i1k-s16-300ep` ViTs, FlexiViT, the
SigLIP image towers) writes its own layout, told apart from the official one
by its keys:

- `pos_embedding` at the top level, added before the class token is
  concatenated: the class token has no position (keras_vit's
  `no_embed_class`); `posemb="sincos2d"` files have no table at all;
- blocks named as Flax's `nn.compact` numbers them
  (`MultiHeadDotProductAttention_0`, `LayerNorm_1`, `MlpBlock_0` for the
  official `_1`, `LayerNorm_2`, `MlpBlock_3`), or stacked under
  `Transformer/encoderblock/` by `scan=True`;
- `pool_type`: `"map"` (`MAPHead_0`, keras_vit's `classifier="map"`),
  `"tok"` (`cls`), `"gap"` (its default: the mean of all tokens);
- `rep_size`: `pre_logits` (Dense + tanh), as the official files;
- a `params/`, `params/img/` (SigLIP's image tower) or `opt/target/` prefix.

Numerics are big_vision's: tanh-approximate GELU, LayerNorm eps 1e-6, inputs
in [-1, 1], positions resized corner-aligned bilinear (`resample_posemb`'s
`scipy.ndimage.zoom(order=1)`). The weights cannot tell `pool_type="gap"`
from `"0"` (the first patch token) or `"none"`: such files are read as
`"gap"`. A `sincos2d` file does not say its grid: pass `image_size`.
"""

import math
import re
import zipfile

from keras_vit.checkpoints import files
from keras_vit.checkpoints.official import read_npz
from keras_vit.config import ViTConfig

DESCRIPTION = "a big_vision '.npz' (local)"
# Prefixes big_vision's savers put before the model's keys, the image tower's last (SigLIP: params/img/).
_PREFIXES = ("opt/target/", "params/img/", "params/", "img/")
# big_vision's block sub-module names -> the official ones.
_BLOCK_NAMES = {"LayerNorm_0": "LayerNorm_0", "MultiHeadDotProductAttention_0": "MultiHeadDotProductAttention_1",
                "LayerNorm_1": "LayerNorm_2", "MlpBlock_0": "MlpBlock_3"}
# Keys no other format has: big_vision's position table, its scanned blocks, its block attention.
_MARKERS = re.compile(r"(?:opt/target/|params/(?:img/)?)?(?:pos_embedding|Transformer/encoderblock/.*"
                      r"|Transformer/encoderblock_0/MultiHeadDotProductAttention_0/.*)")


def matches(path):
    """Whether `path` is a local `.npz` holding big_vision's keys (only the zip's directory is read)."""
    path = str(path)
    if not path.endswith(".npz") or files.has_scheme(path):
        return False
    try:
        with zipfile.ZipFile(path) as archive:
            names = [name[: -len(".npy")] for name in archive.namelist()]
    except (OSError, zipfile.BadZipFile):
        return False  # the official reader names what is wrong with the file
    return any(_MARKERS.fullmatch(name) for name in names)


def read(path, image_size=None, num_heads=None):
    """`(ViTConfig, arrays)` of a big_vision file, the arrays under official keys.

    Args:
        path: a local big_vision `.npz`.
        image_size: int or (height, width). Needed for `sincos2d` files (no
            table to read the grid off) and for non-square learned tables.
        num_heads: read off the attention kernels; the registry's common signature.
    """
    arrays = to_official(read_npz(path), str(path))
    return big_vision_config(arrays, str(path), image_size), arrays


def read_arrays(path, config=None):
    """`(None, arrays)`: a big_vision file states no configuration beyond its shapes."""
    return None, to_official(read_npz(path), str(path))


def to_official(arrays, source):
    """big_vision's arrays under the official keys (prefix dropped, blocks renamed and unstacked)."""
    arrays = _without_prefix(arrays)
    out = {}
    for key, value in arrays.items():
        scanned = re.fullmatch(r"Transformer/encoderblock/([^/]+)/(.*)", key)
        block = re.fullmatch(r"Transformer/encoderblock_(\d+)/([^/]+)/(.*)", key)
        if scanned:
            module, rest = scanned.groups()
            for i, part in enumerate(value):
                out[f"Transformer/encoderblock_{i}/{_block_name(module, key, source)}/{rest}"] = part
        elif block:
            index, module, rest = block.groups()
            out[f"Transformer/encoderblock_{index}/{_block_name(module, key, source)}/{rest}"] = value
        elif key == "pos_embedding":
            out["Transformer/posembed_input/pos_embedding"] = value
        else:
            out[key] = value
    if "embedding/kernel" not in out or "Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel" \
            not in out:
        raise ValueError(f"{source} is not a big_vision ViT checkpoint: expected 'embedding/kernel' and "
                         "Transformer/encoderblock_0/MultiHeadDotProductAttention_0/query/kernel (or the scanned "
                         f"Transformer/encoderblock/...), found {len(arrays)} arrays, e.g. {sorted(arrays)[:6]}")
    return out


def _without_prefix(arrays):
    for prefix in _PREFIXES:
        if f"{prefix}embedding/kernel" in arrays:
            return {key[len(prefix):]: value for key, value in arrays.items() if key.startswith(prefix)}
    return arrays


def _block_name(module, key, source):
    if module not in _BLOCK_NAMES:
        raise ValueError(f"{source}: {key!r} is no part of big_vision's encoder block; expected one of "
                         f"{sorted(_BLOCK_NAMES)}")
    return _BLOCK_NAMES[module]


def big_vision_config(arrays, source, image_size=None):
    """The `ViTConfig` of big_vision arrays (under official keys), read off their shapes."""
    block = "Transformer/encoderblock_0/"
    head = sorted(key for key in arrays if key.startswith("MAPHead_0/"))
    if head and "MAPHead_0/probe" not in arrays:  # without it the file would read as another pooling
        raise ValueError(f"{source} holds a MAP head without its probe: expected 'MAPHead_0/probe' beside "
                         f"{len(head)} MAPHead_0 arrays, found none (e.g. {head[:3]})")
    patch_h, patch_w, channels, width = arrays["embedding/kernel"].shape
    class_token = "cls" in arrays
    fields = dict(
        patch_size=(patch_h, patch_w), hidden_size=width, channels=channels,
        num_heads=arrays[block + "MultiHeadDotProductAttention_1/query/kernel"].shape[1],
        mlp_dim=arrays[block + "MlpBlock_3/Dense_0/kernel"].shape[-1],
        num_layers=len({m.group(1) for k in arrays if (m := re.match(r"Transformer/encoderblock_(\d+)/", k))}),
        classifier="map" if "MAPHead_0/probe" in arrays else "token" if class_token else "gap",
        class_token=class_token,
        classes=arrays["head/kernel"].shape[-1] if "head/kernel" in arrays else 0,
        representation_size=arrays["pre_logits/kernel"].shape[-1] if "pre_logits/kernel" in arrays else None,
        # big_vision's numerics (Flax defaults; `value_range(-1, 1)` inputs; `resample_posemb`).
        gelu_approximate=True, layer_norm_epsilon=1e-6, interpolation="bilinear",
    )
    table = arrays.get("Transformer/posembed_input/pos_embedding")
    if table is None:
        if image_size is None:
            raise ValueError(f"{source} has no pos_embedding (big_vision's posemb='sincos2d'): the patch grid "
                             "cannot be read off the file; pass image_size")
        fields.update(position_embedding="sincos_2d", image_size=image_size)
    else:
        fields.update(_learned_positions(table.shape[1], class_token, (patch_h, patch_w), source, image_size))
    try:
        return ViTConfig(**fields)
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None


def _learned_positions(rows, class_token, patch, source, image_size):
    """The fields of a learned table of `rows` rows: a square grid, or the old layout with the class token's row."""
    if image_size is not None:
        size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        grid = tuple(s // p for s, p in zip(size, patch, strict=True))
        if math.prod(grid) == rows:
            return dict(position_embedding="learned_1d", no_embed_class=class_token, image_size=size)
    side = math.isqrt(rows)
    if side * side == rows:  # big_vision's layout: positions for the patches only
        return dict(position_embedding="learned_1d", no_embed_class=class_token,
                    image_size=(side * patch[0], side * patch[1]))
    side = math.isqrt(rows - 1)
    if class_token and side * side == rows - 1:  # older files: a row for the class token, added after concatenation
        return dict(position_embedding="learned_1d", no_embed_class=False,
                    image_size=(side * patch[0], side * patch[1]))
    raise ValueError(f"{source}: pos_embedding holds {rows} positions, not a square grid; pass image_size")
