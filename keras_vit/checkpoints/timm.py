"""timm / Hugging Face `safetensors` ViT and DeiT checkpoints, read without torch.

timm (`timm/models/vision_transformer.py`, `deit.py`) saves a model as
`model.safetensors` plus `config.json` (`timm.models.save_for_hf`, the layout
of `timm/...` repositories on the Hugging Face hub). `read` turns either that
directory or a bare `.safetensors` file into a `ViTConfig` and arrays under
the official google-research/vision_transformer `.npz` keys, which
`keras_vit.checkpoints.loading` then loads like any official file.

The architecture comes from the files alone: `config.json` (its
`architecture`, looked up in `ARCHITECTURES`, `REGISTER_AND_MAP_ARCHITECTURES`
or `FAMILY_ARCHITECTURES`, then `pretrained_cfg`, then `model_args`, the
precedence timm's own loader applies), checked against the weight shapes;
without `config.json`, from the shapes alone (a later family's bare file is
refused: its numerics are in `config.json` only). Register tokens, MAP
pooling, and the later families' LayerScale, pre-norm, q/k norm, RMSNorm,
SwiGLU and patch norm are read under keras_vit's extension keys; what
keras_vit cannot represent raises a ValueError naming the file, rather than
being dropped.
"""

import json
import logging
import math
import os
import re

import numpy as np

from keras_vit.checkpoints.safetensors import read_safetensors
from keras_vit.checks import to_pair
from keras_vit.config import ViTConfig
from keras_vit.variants import SIZES

# ------------------------------------------------------------- architectures
# timm's registered ViT/DeiT builders keras_vit reads, with the model_args each
# passes (`@register_model` functions of vision_transformer.py and deit.py,
# timm 1.0.31); img_size is the resolution in the name. `num_heads` cannot be
# read off the weights, hence the table. tests/fixtures/timm/architectures.json
# holds what timm itself builds for every such name; a test compares.
# timm's size names, and keras_vit's for the same sizes (`keras_vit.variants.SIZES`, the one table of sizes).
_SIZE_NAMES = {"tiny": "Ti", "small": "S", "medium": "M", "base": "B", "large": "L", "huge": "H", "giant": "g"}
_GAP = dict(class_token=False, global_pool="avg", fc_norm=False)


def _architecture(family, size, patch, resolution, **extra):
    dims = SIZES[_SIZE_NAMES[size]]
    name = f"{family}_{size}_patch{patch}_{'gap_' if extra else ''}{resolution}"
    args = dict(embed_dim=dims.hidden_size, depth=dims.num_layers, num_heads=dims.num_heads, patch_size=patch,
                img_size=resolution)
    if dims.mlp_dim != 4 * dims.hidden_size:  # timm's mlp_ratio defaults to 4 (giant's is 48 / 11)
        args["mlp_ratio"] = dims.mlp_dim / dims.hidden_size
    return name, {**args, **extra}


ARCHITECTURES = dict(
    [_architecture("vit", "tiny", 16, r) for r in (224, 384)]
    + [_architecture("vit", "small", p, r) for p in (16, 32) for r in (224, 384)]
    + [_architecture("vit", "small", 8, 224), _architecture("vit", "base", 8, 224)]
    + [_architecture("vit", s, p, r) for s in ("base", "large") for p in (16, 32) for r in (224, 384)]
    + [_architecture("vit", s, 14, 224) for s in ("large", "huge", "giant")]
    + [_architecture("deit", s, 16, 224) for s in ("tiny", "small", "base")]
    + [_architecture("deit", "base", 16, 384)]
    # deit.py's VisionTransformerDistilled: a distillation token and head (keras_vit's `distilled`).
    + [(f"deit_{s}_distilled_patch16_{r}", dict(_architecture("deit", s, 16, r)[1], distilled=True))
       for s, r in (("tiny", 224), ("small", 224), ("base", 224), ("base", 384))]
    + [_architecture("vit", "base", 16, 224, **_GAP, num_heads=16), _architecture("vit", "huge", 14, 224, **_GAP),
       _architecture("vit", "huge", 16, 448, **_GAP), _architecture("vit", "giant", 16, 224, **_GAP)]
)
# Register-token and MAP-pooled ViTs (`vit_*_reg4_gap_*`, the SigLIP image towers), with the model_args timm
# registers them with; tests/fixtures/timm_extra/architectures.json holds what timm builds for each, and a test
# compares. Their neighbours with layer scale (`init_values`) are not here: keras_vit has none.
_SIGLIP = dict(class_token=False, global_pool="map")
REGISTER_AND_MAP_ARCHITECTURES = {
    "vit_base_patch16_reg4_gap_256": dict(embed_dim=768, depth=12, num_heads=12, patch_size=16, img_size=256,
                                          class_token=False, no_embed_class=True, global_pool="avg", reg_tokens=4),
    **{f"vit_base_patch16_siglip_{r}": dict(embed_dim=768, depth=12, num_heads=12, patch_size=16, img_size=r,
                                            **_SIGLIP) for r in (224, 256, 384, 512)},
    **{f"vit_large_patch16_siglip_{r}": dict(embed_dim=1024, depth=24, num_heads=16, patch_size=16, img_size=r,
                                             **_SIGLIP) for r in (256, 384)},
    "vit_so400m_patch14_siglip_224": dict(embed_dim=1152, depth=27, num_heads=16, patch_size=14, img_size=224,
                                          mlp_ratio=3.7362, **_SIGLIP),
}

# The later families (vision_transformer.py's and deit.py's builders, timm 1.0.31), each with what its builder
# passes: timm's model_args where JSON holds them (init_values, pre_norm, qkv_bias, proj_bias, act_layer, ...),
# and keras_vit's words for the layer classes it passes (`norm_layer` 'layernorm' | 'rmsnorm' with `norm_eps`,
# `embed_norm` for AIMv2's patch_embed norm, `mlp_layer` 'swiglu_packed' (GluMlp, gate first) | 'swiglu').
# Their files' model_args hold only what create_model was given, so the family's defaults come from here.
# tests/fixtures/families/architectures.json holds what each builder passes; a test compares.
# The CLIP towers timm registers: (patch, width, depth, heads[, mlp_ratio]) and the names' tails.
_CLIP_TOWERS = {
    "base_patch16": ((16, 768, 12, 12), ("224", "384", "quickgelu_224")),
    "base_patch16_plus": ((16, 896, 12, 14), ("240",)),
    "base_patch32": ((32, 768, 12, 12), ("224", "256", "384", "448", "quickgelu_224")),
    "betwixt_patch32": ((32, 640, 12, 10), ("224",)),
    "giant_patch14": ((14, 1408, 40, 16, 48 / 11), ("224",)),
    "gigantic_patch14": ((14, 1664, 48, 16, 64 / 13), ("224", "378", "quickgelu_224")),
    "huge_patch14": ((14, 1280, 32, 16), ("224", "336", "378", "quickgelu_224", "quickgelu_378")),
    "large_patch14": ((14, 1024, 24, 16), ("224", "336", "quickgelu_224", "quickgelu_336")),
    "medium_patch16": ((16, 512, 12, 8), ("224",)),
    "medium_patch32": ((32, 512, 12, 8), ("224",)),
    "xsmall_patch16": ((16, 256, 10, 4), ("224",)),
}
_CLIP = dict(pre_norm=True, norm_eps=1e-5)
_AIMV2 = dict(class_token=False, fc_norm=False, global_pool="avg", qkv_bias=False, proj_bias=False, act_layer="silu",
              norm_layer="rmsnorm", norm_eps=1e-5, embed_norm=True, mlp_layer="swiglu")
_DINOV2_GIANT = dict(mlp_ratio=5.33334, mlp_layer="swiglu_packed", act_layer="silu")


def _sized(patch, width, depth, heads, **extra):
    return dict(patch_size=patch, embed_dim=width, depth=depth, num_heads=heads, **extra)


_DINOV2_SIZES = {"small": (384, 12, 6), "base": (768, 12, 12), "large": (1024, 24, 16), "giant": (1536, 40, 24)}
_DEIT3_SIZES = {"small": (16, 384, 12, 6), "medium": (16, 512, 12, 8), "base": (16, 768, 12, 12),
                "large": (16, 1024, 24, 16), "huge": (14, 1280, 32, 16)}
_AIMV2_SIZES = {"large": (1024, 8, 2.75), "huge": (1536, 12, 2.6667), "1b": (2048, 16, 2.75), "3b": (3072, 24, 2.6667)}
FAMILY_ARCHITECTURES = {
    **{f"vit_{size}_patch14_{reg}dinov2": _sized(
        14, *dims, init_values=1e-5, **(_DINOV2_GIANT if size == "giant" else {}),
        **(dict(reg_tokens=4, no_embed_class=True) if reg else {}))
       for size, dims in _DINOV2_SIZES.items() for reg in ("", "reg4_")},
    **{f"deit3_{size}_patch{patch}_{r}": _sized(patch, *dims, no_embed_class=True, init_values=1e-6, img_size=r)
       for size, (patch, *dims) in _DEIT3_SIZES.items() for r in (224, 384)
       if (size, r) not in (("medium", 384), ("huge", 384))},
    **{f"vit_{tower}_clip_{tail}": _sized(
        *dims[:4], **({"mlp_ratio": dims[4]} if len(dims) > 4 else {}), img_size=int(tail.rpartition("_")[2]),
        **_CLIP, **({"act_layer": "quick_gelu"} if tail.startswith("quickgelu") else {}))
       for tower, (dims, tails) in _CLIP_TOWERS.items() for tail in tails},
    **{f"aimv2_{size}_patch14_{r}": _sized(14, width, 24, heads, mlp_ratio=ratio, img_size=r, **_AIMV2)
       for size, (width, heads, ratio) in _AIMV2_SIZES.items() for r in (224, 336, 448)},
}

# timm's width -> heads of its named sizes, for files without config.json.
HEADS_BY_WIDTH = {SIZES[ours].hidden_size: SIZES[ours].num_heads for ours in _SIZE_NAMES.values()}

# model_args keras_vit represents (mapped in `_config`), and those that only
# shape training or initialisation (no effect on the outputs).
_READ_ARGS = {"img_size", "patch_size", "in_chans", "num_classes", "global_pool", "embed_dim", "depth", "num_heads",
              "mlp_ratio", "class_token", "pos_embed", "no_embed_class", "fc_norm", "dynamic_img_size",
              "drop_path_rate", "attn_drop_rate", "proj_drop_rate", "reg_tokens", "act_layer", "qkv_bias", "qk_norm",
              "init_values", "pre_norm", "proj_bias", "norm_layer"}
_TRAINING_ARGS = {"drop_rate", "pos_drop_rate", "patch_drop_rate", "weight_init", "fix_init"}
# model_args that change the network, at the value keras_vit's network has.
_FIXED_ARGS = {"scale_attn_norm": False, "scale_mlp_norm": False, "final_norm": True,
               "pool_include_prefix": False, "dynamic_img_pad": False, "embed_layer": None,
               "embed_norm_layer": None, "block_fn": None, "mlp_layer": None, "attn_layer": None}
# timm's norm_layer names (model_args) and keras_vit's.
_NORM_LAYERS = {None: "layer_norm", "layernorm": "layer_norm", "rmsnorm": "rms_norm"}

# Weights of timm features keras_vit does not have, and what they are.
_UNSUPPORTED_WEIGHTS = (
    (r"attn_pool\.(q_norm|k_norm)\..*", "qk-norm in the attention pooling (`attn_pool.q_norm` / `k_norm`)"),
    (r"attn_pool\.pos_embed", "a position table in the attention pooling (`attn_pool.pos_embed`)"),
    (r"blocks\.\d+\.(attn|mlp)\.norm\..*", "a norm inside attention or the MLP (scale_attn_norm / scale_mlp_norm)"),
)
# Weights of the later families whose numerics (epsilon, activation, init) only config.json says: a bare file
# holding them is refused rather than read with timm's defaults.
_NEEDS_CONFIG = (
    (r"blocks\.\d+\.ls[12]\.gamma", "LayerScale"), (r"norm_pre\..*", "a norm before the blocks (pre_norm)"),
    (r"blocks\.\d+\.attn\.[qk]_norm\..*", "q/k norm"), (r"patch_embed\.norm\..*", "a patch-embedding norm"),
)


# ------------------------------------------------------- the format's registry entry
# What `read_checkpoint` and `load_checkpoint` accept in this format (`keras_vit.checkpoints.FORMATS`).
DESCRIPTION = "a timm / Hugging Face '.safetensors' file or model directory"


def matches(path):
    """Whether `path` is a `.safetensors` file or a directory (a Hugging Face model directory)."""
    return str(path).endswith(".safetensors") or os.path.isdir(str(path))


def read_arrays(path, config=None):
    """`(stated ViTConfig or None, arrays)`: arrays under official keys; the config when `config.json` states one.

    `config` (the model's) gives the heads and grid of a bare `.safetensors` file, which states nothing.
    """
    stated, arrays = read(path, num_heads=config and config.num_heads, image_size=config and config.image_size)
    return (stated if has_config(path) else None), arrays


# ------------------------------------------------------------------ reading
def read(path, image_size=None, num_heads=None):
    """`(ViTConfig, arrays)` of a timm / Hugging Face checkpoint, `arrays` under official keys.

    Args:
        path: a `.safetensors` file (a `config.json` beside it is read too) or
            a directory holding `model.safetensors` and `config.json`.
        image_size: int or (height, width). Only for files without
            `config.json` whose position table is not a square grid (used
            where the table has exactly its positions).
        num_heads: int. Only for files without `config.json` whose width is
            not one of timm's named sizes (`HEADS_BY_WIDTH`).

    Returns:
        The `ViTConfig` (timm's numerics: exact GELU, LayerNorm eps 1e-6,
        bicubic position resizing) and `{official key: np.ndarray}`.

    Raises:
        ValueError: naming the file, what was expected and what was found.
    """
    weights_path, config_path = _locate(str(path))
    tensors = _packed_swiglu(read_safetensors(weights_path))
    _check_supported(tensors, weights_path)
    facts = _weight_facts(tensors, weights_path)
    if config_path is None:
        logging.info("%s has no config.json beside it: its architecture is read off the weight shapes", weights_path)
        _refuse_later_families(tensors, facts, weights_path)
        config = _config_from_weights(facts, weights_path, num_heads, image_size)
    else:
        config = _config_from_json(_load_json(config_path), facts, config_path, num_heads)
    return config, _to_official(tensors, config, weights_path)


def _packed_swiglu(tensors):
    """`tensors` with each block's split SwiGLU (`fc1_g`, `fc1_x`: AIMv2) packed as one `fc1`, gate rows first:
    the layout of timm's SwiGLUPacked and of keras_vit's gated MLP."""
    packed = dict(tensors)
    for name in [n for n in tensors if re.fullmatch(r"blocks\.\d+\.mlp\.fc1_g\.(weight|bias)", n)]:
        value = name.replace(".fc1_g.", ".fc1_x.")
        if value in tensors:
            packed[name.replace(".fc1_g.", ".fc1.")] = np.concatenate([packed.pop(name), packed.pop(value)])
    return packed


def _refuse_later_families(tensors, facts, source):
    """A bare file of a later family is refused: its epsilon, activation and biases are in config.json only."""
    found = [what for pattern, what in _NEEDS_CONFIG if any(re.fullmatch(pattern, name) for name in tensors)]
    if facts["gated_mlp"]:
        found.append("a gated MLP")
    if "blocks.0.norm1.weight" in tensors and "blocks.0.norm1.bias" not in tensors:
        found.append("RMSNorm")
    if not facts["proj_bias"] or "blocks.0.attn.qkv.bias" not in tensors:
        found.append("projections without bias")
    if found:
        raise ValueError(f"{source} has {', '.join(dict.fromkeys(found))}, whose epsilon, activation and biases "
                         "only timm's config.json states; expected it beside the file (pass the model directory)")


def has_config(path):
    """Whether the checkpoint at `path` states its architecture (a `config.json`)."""
    return _locate(str(path))[1] is not None


def _locate(path):
    """`(model.safetensors path, config.json path or None)`."""
    if os.path.isdir(path):
        weights, config = os.path.join(path, "model.safetensors"), os.path.join(path, "config.json")
        if not os.path.isfile(weights):
            raise ValueError(f"{path} is not a Hugging Face timm model directory: expected model.safetensors, "
                             f"found {sorted(os.listdir(path))}")
        if not os.path.isfile(config):
            raise ValueError(f"{path} is not a Hugging Face timm model directory: expected config.json beside "
                             "model.safetensors; pass the .safetensors file itself to read its shapes alone")
        return weights, config
    if not path.endswith(".safetensors"):
        raise ValueError(f"Expected a .safetensors file or a Hugging Face model directory; received {path!r}")
    if not os.path.isfile(path):
        raise ValueError(f"{path} does not exist (expected a local .safetensors file)")
    config = os.path.join(os.path.dirname(path), "config.json")
    return path, config if os.path.isfile(config) else None


def _load_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is not a timm config.json: expected JSON, found {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a timm config.json: expected a JSON object, found {type(data).__name__}")
    return data


def _check_supported(tensors, source):
    """Raises on weights of a timm feature keras_vit lacks, naming the feature."""
    for pattern, feature in _UNSUPPORTED_WEIGHTS:
        found = sorted(name for name in tensors if re.fullmatch(pattern, name))
        if found:
            raise ValueError(f"{source} has {feature}, which keras_vit's ViT does not have; found {found[:4]}")


# The names transformers' ViT, DeiT, DINOv2, CLIP and SigLIP tensors start with.
_TRANSFORMERS_PREFIXES = ("embeddings.patch_embeddings.", "embeddings.patch_embedding.", "vit.", "deit.", "dinov2.",
                          "vision_model.")


def _weight_facts(tensors, source):
    """What the shapes say: patch, width, depth, MLP, channels, tokens, norms, head."""
    if any(name.startswith(_TRANSFORMERS_PREFIXES) for name in tensors):
        # transformers' names: its config.json states heads, epsilon, activation and pooler, which shapes cannot.
        raise ValueError(f"{source} holds transformers tensors (e.g. {sorted(tensors)[0]!r}), not a timm "
                         "checkpoint; expected its folder, with the config.json beside model.safetensors "
                         "(save_pretrained's directory), found no config.json")
    for key in ("patch_embed.proj.weight", "blocks.0.attn.qkv.weight", "blocks.0.mlp.fc1.weight",
                "blocks.0.mlp.fc2.weight"):
        if key not in tensors:
            raise ValueError(f"{source} is not a timm ViT checkpoint: expected a tensor {key!r}, found "
                             f"{len(tensors)} tensors, e.g. {sorted(tensors)[:6]}")
    width, channels, patch_h, patch_w = tensors["patch_embed.proj.weight"].shape
    blocks = {int(m.group(1)) for name in tensors if (m := re.match(r"blocks\.(\d+)\.", name))}
    pos = tensors.get("pos_embed")
    return dict(
        patch_size=(patch_h, patch_w), hidden_size=width, channels=channels,
        # The MLP's hidden width is fc2's input: a gated MLP's fc1 gives twice that (gate and value).
        num_layers=max(blocks) + 1, mlp_dim=tensors["blocks.0.mlp.fc2.weight"].shape[1],
        gated_mlp=tensors["blocks.0.mlp.fc1.weight"].shape[0] == 2 * tensors["blocks.0.mlp.fc2.weight"].shape[1],
        proj_bias="blocks.0.attn.proj.bias" in tensors,
        class_token="cls_token" in tensors, distilled="dist_token" in tensors, fc_norm="fc_norm.weight" in tensors,
        num_register_tokens=tensors["reg_token"].shape[1] if "reg_token" in tensors else 0,
        map_head="attn_pool.latent" in tensors,
        positions=None if pos is None else pos.shape[1],
        classes=tensors["head.weight"].shape[0] if "head.weight" in tensors else 0, names=set(tensors),
        representation_size=tensors["pre_logits.fc.weight"].shape[0] if "pre_logits.fc.weight" in tensors else None,
    )


# Fixed timm conventions: exact (erf) GELU (PyTorch's nn.GELU), LayerNorm eps
# 1e-6 (timm's ViT norm_layer), position tables resized bicubic
# (timm's `resample_abs_pos_embed`).
_TIMM_NUMERICS = dict(gelu_approximate=False, layer_norm_epsilon=1e-6, interpolation="bicubic")


def _config_from_weights(facts, source, num_heads, image_size):
    """A file without config.json: everything from the shapes, heads from timm's sizes."""
    width = facts["hidden_size"]
    if num_heads is None:
        num_heads = HEADS_BY_WIDTH.get(width)
    if num_heads is None:
        raise ValueError(f"{source}: the number of attention heads cannot be read off the weights and width "
                         f"{width} is none of timm's named sizes {HEADS_BY_WIDTH}; pass num_heads")
    no_embed_class, grid = _grid_from_positions(facts, source, image_size)
    # timm's defaults: token pooling with a class token; its fc_norm is on
    # exactly for average pooling.
    classifier = "map" if facts["map_head"] else "gap" if facts["fc_norm"] or not facts["class_token"] else "token"
    return _make_config(source, facts, num_heads=num_heads, grid=grid, classifier=classifier,
                        no_embed_class=no_embed_class)


def _grid_from_positions(facts, source, image_size):
    """`(no_embed_class, grid)` from the position table's length, and `image_size` where it fits.

    `image_size` may be the target of a resize rather than the file's size:
    it is taken only when the table has exactly its positions. timm's default
    layout (the prefix tokens have rows) is read first, at `image_size` or as
    a square, then DeiT-3's (they have none): a size must not turn a square
    table of the default layout into another layout's.
    """
    class_token, positions = facts["class_token"], facts["positions"]
    grid = None
    if image_size is not None:
        size = to_pair(image_size, "image_size")
        grid = tuple(s // p for s, p in zip(size, facts["patch_size"], strict=True))
    if positions is None:
        if grid is None:
            raise ValueError(f"{source} has no pos_embed and no config.json: the patch grid cannot be read; "
                             "pass image_size")
        return False, grid
    prefix = int(class_token) + int(facts["distilled"]) + facts["num_register_tokens"]
    for rows, no_embed_class in ((prefix, False), (0, True)) if class_token else ((0, False),):
        side = math.isqrt(positions - rows)
        for candidate in ([grid] if grid else []) + [(side, side)]:
            if math.prod(candidate) == positions - rows:
                return no_embed_class, candidate
    raise ValueError(f"{source}: pos_embed holds {positions} positions, not a square grid (+ class token); "
                     "pass image_size=(height, width)")


def _config_from_json(cfg, facts, source, num_heads):
    """config.json's architecture and arguments, checked against the shapes."""
    args = _timm_args(cfg, source)
    if num_heads is not None and num_heads != args["num_heads"]:
        raise ValueError(f"{source} says num_heads={args['num_heads']}; received num_heads={num_heads}")
    pool = args.get("global_pool", "token")
    if pool not in _POOLS:
        raise ValueError(f"{source}: global_pool={pool!r}; keras_vit pools 'token' (class token), 'avg' (mean) "
                         "or 'map' (attention pooling)")
    fc_norm = args.get("fc_norm")
    size = to_pair(args.get("img_size", 224), f"img_size of {source}")
    patch = args.get("patch_size", 16)
    patch = (patch, patch) if isinstance(patch, int) else tuple(patch)
    mlp_layer = args.get("mlp_layer", "mlp")
    hidden = int(args.get("embed_dim", 768) * args.get("mlp_ratio", 4.0))  # timm's Block; GluMlp halves it
    stated = dict(
        hidden_size=args.get("embed_dim", 768), num_layers=args.get("depth", 12), patch_size=patch,
        mlp_dim=hidden // 2 if mlp_layer == "swiglu_packed" else hidden, gated_mlp=mlp_layer != "mlp",
        proj_bias=args.get("proj_bias", True), channels=args.get("in_chans", 3),
        classes=args.get("num_classes", 1000), class_token=args.get("class_token", True),
        fc_norm=pool == "avg" if fc_norm is None else fc_norm, representation_size=None,
        distilled=args.get("distilled", False), num_register_tokens=args.get("reg_tokens", 0), map_head=pool == "map",
    )
    for name, value in stated.items():
        if value != facts[name]:
            raise ValueError(f"{source} says {name}={value!r} but the weights have {name}={facts[name]!r}")
    grid = tuple(s // p for s, p in zip(size, patch, strict=True))
    no_embed_class = bool(args.get("no_embed_class", False))
    _check_positions(facts, grid, no_embed_class, args.get("pos_embed", "learn"), source)
    return _make_config(source, facts, num_heads=args["num_heads"], grid=grid,
                        classifier=_POOLS[pool], no_embed_class=no_embed_class,
                        **_activation(args.get("act_layer"), source), **_block_fields(args, source),
                        **_pretrained_fields(cfg), **_training_fields(args))


# timm's global_pool -> keras_vit's classifier.
_POOLS = {"token": "token", "avg": "gap", "map": "map"}
# timm's act_layer names keras_vit's MLP computes: (activation, gelu_approximate).
_ACTIVATIONS = {None: ("gelu", False), "gelu": ("gelu", False), "gelu_tanh": ("gelu", True),
                "quick_gelu": ("quick_gelu", False), "silu": ("silu", False), "swish": ("silu", False)}


def _activation(act_layer, source):
    if act_layer not in _ACTIVATIONS:
        raise ValueError(f"{source}: act_layer={act_layer!r}; keras_vit's MLP computes act_layer "
                         f"{sorted(filter(None, _ACTIVATIONS))} (or none: exact GELU)")
    activation, approximate = _ACTIVATIONS[act_layer]
    return dict(activation=activation, gelu_approximate=approximate)


def _block_fields(args, source):
    """The later families' blocks (LayerScale, pre-norm, q/k norm, norms, biases, SwiGLU) as ViTConfig fields."""
    if args.get("norm_layer") not in _NORM_LAYERS:
        raise ValueError(f"{source}: norm_layer={args['norm_layer']!r}; keras_vit reads timm's norm_layer "
                         f"{sorted(filter(None, _NORM_LAYERS))}")
    pre_norm = bool(args.get("pre_norm", False))
    return dict(layer_scale_init=args.get("init_values"), norm_pre=pre_norm, patch_bias=not pre_norm,
                qkv_bias="all" if args.get("qkv_bias", True) else "none", qk_norm=bool(args.get("qk_norm", False)),
                norm_layer=_NORM_LAYERS[args.get("norm_layer")], layer_norm_epsilon=args.get("norm_eps", 1e-6),
                patch_norm=bool(args.get("embed_norm", False)), gated_mlp=args.get("mlp_layer", "mlp") != "mlp")


def _timm_args(cfg, source):
    """timm's model arguments: architecture table < pretrained_cfg < top level < model_args (timm's order)."""
    pretrained = cfg.get("pretrained_cfg") or cfg  # older files: one flat dict
    architecture = cfg.get("architecture")
    table = {**ARCHITECTURES, **REGISTER_AND_MAP_ARCHITECTURES, **FAMILY_ARCHITECTURES}
    if architecture not in table:
        raise ValueError(f"{source}: architecture {architecture!r} is not a timm ViT keras_vit reads; expected one "
                         f"of {len(table)} names: the vit_*, deit_*, deit3_*, *_dinov2, *_clip_* and aimv2_* in "
                         "docs/checkpoints.md")
    args = dict(table[architecture])
    for holder, where in ((pretrained, "pretrained_cfg." if pretrained is not cfg else ""), (cfg, ""),
                          (cfg.get("model_args") or {}, "model_args.")):
        _check_numbers(holder, where, source)
    if pretrained.get("input_size"):
        args["in_chans"] = pretrained["input_size"][0]
        if pretrained.get("fixed_input_size", False):  # as timm: only sizes it fixes
            args["img_size"] = list(pretrained["input_size"][1:])
    for key in ("num_classes", "global_pool"):
        for holder in (pretrained, cfg):
            if holder.get(key) is not None and not (key == "num_classes" and holder[key] < 0):
                args[key] = holder[key]
    model_args = cfg.get("model_args") or {}
    _check_model_args(model_args, source)
    args.update({k: v for k, v in model_args.items() if k in _READ_ARGS})
    return args


# The config.json fields read as numbers: ints (sizes, counts) or floats, a list of them where a size or a
# per-channel value may stand. A number written as a string ("768") is refused naming the field.
_INTS = {"img_size", "patch_size", "in_chans", "num_classes", "embed_dim", "depth", "num_heads", "reg_tokens",
         "input_size"}
_FLOATS = {"mlp_ratio", "drop_path_rate", "attn_drop_rate", "proj_drop_rate", "mean", "std"}
_LISTS = {"img_size", "patch_size", "input_size", "mean", "std"}


def _check_numbers(holder, where, source):
    """Raises ValueError naming the file and field of the first number written as anything else."""
    for key in sorted((_INTS | _FLOATS) & set(holder)):
        value = holder[key]
        items = value if isinstance(value, list) and key in _LISTS else [value]
        kinds, kind = ((int,), "an integer") if key in _INTS else ((int, float), "a number")
        if value is not None and not all(isinstance(v, kinds) and not isinstance(v, bool) for v in items):
            kind += " or a list of them" if key in _LISTS else ""
            raise ValueError(f"{source}: {where}{key} must be {kind} (JSON numbers, unquoted); "
                             f"received {key}={value!r}")


def _check_model_args(model_args, source):
    """Unknown arguments, and ones that change the network away from keras_vit's, raise."""
    unknown = sorted(set(model_args) - _READ_ARGS - _TRAINING_ARGS - set(_FIXED_ARGS))
    if unknown:
        raise ValueError(f"{source}: model_args {unknown} are unknown to keras_vit's timm reader; expected only "
                         f"{sorted(_READ_ARGS | _TRAINING_ARGS | set(_FIXED_ARGS))}")
    changed = {k: v for k, v in model_args.items() if k in _FIXED_ARGS and v != _FIXED_ARGS[k]}
    if changed:
        expected = {k: _FIXED_ARGS[k] for k in changed}
        raise ValueError(f"{source}: model_args {changed} make a network keras_vit's ViT cannot represent; "
                         f"expected {expected}")
    if model_args.get("pos_embed", "learn") not in ("learn", "", "none"):
        raise ValueError(f"{source}: pos_embed={model_args['pos_embed']!r}; expected 'learn', '' or 'none'")


def _check_positions(facts, grid, no_embed_class, pos_embed, source):
    """The position table must be the stated grid (+ the class token's row unless no_embed_class)."""
    if pos_embed in ("", "none"):
        expected = None
    else:
        prefix = int(facts["class_token"]) + int(facts["distilled"]) + facts["num_register_tokens"]
        expected = math.prod(grid) + (prefix if not no_embed_class else 0)
    if facts["positions"] != expected:
        raise ValueError(f"{source} says a {grid[0]}x{grid[1]} patch grid (pos_embed={pos_embed!r}, "
                         f"no_embed_class={no_embed_class}), hence {expected} positions; the weights' pos_embed "
                         f"has {facts['positions']}")


def _pretrained_fields(cfg):
    """input_mean / input_std from pretrained_cfg (what timm's transforms normalise with)."""
    pretrained = cfg.get("pretrained_cfg") or cfg
    fields = {}
    if pretrained.get("mean") is not None:
        fields["input_mean"] = tuple(pretrained["mean"])
    if pretrained.get("std") is not None:
        fields["input_std"] = tuple(pretrained["std"])
    return fields


def _training_fields(args):
    """timm's dropout rates under keras_vit's names (no effect on inference), and dynamic sizes."""
    fields = dict(drop_path_rate=args.get("drop_path_rate", 0.0), dropout_rate=args.get("proj_drop_rate", 0.0),
                  attention_dropout_rate=args.get("attn_drop_rate", 0.0))
    if args.get("dynamic_img_size"):
        fields["dynamic_image_size"] = True
    return fields


def _make_config(source, facts, num_heads, grid, classifier, no_embed_class, **extra):
    """The ViTConfig; its own checks' errors name the file."""
    try:
        return ViTConfig(
            patch_size=facts["patch_size"], hidden_size=facts["hidden_size"], mlp_dim=facts["mlp_dim"],
            num_heads=num_heads, num_layers=facts["num_layers"], channels=facts["channels"],
            image_size=tuple(g * p for g, p in zip(grid, facts["patch_size"], strict=True)),
            classifier=classifier, class_token=facts["class_token"], distilled=facts["distilled"],
            num_register_tokens=facts["num_register_tokens"], no_embed_class=no_embed_class,
            position_embedding="none" if facts["positions"] is None else "learned_1d",
            fc_norm=facts["fc_norm"], representation_size=facts["representation_size"], classes=facts["classes"],
            **{**_TIMM_NUMERICS, "patch_bias": "patch_embed.proj.bias" in facts["names"], **extra},
        )
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None


# ------------------------------------------------------------------ weights
_BLOCK = "Transformer/encoderblock_{}/"
_ATTENTION = _BLOCK + "MultiHeadDotProductAttention_1/"
_MLP = _BLOCK + "MlpBlock_3/"


def _conv_kernel(w, heads):  # (D, C, ph, pw) -> (ph, pw, C, D)
    return w.transpose(2, 3, 1, 0)


def _dense_kernel(w, heads):  # Linear (out, in) -> Dense (in, out)
    return w.T


def _qkv_kernel(w, heads):
    # Rows are [query; key; value], each D rows in head order: (3D, D) ->
    # three (D, heads, head_dim).
    return tuple(part.T.reshape(part.shape[1], heads, -1) for part in np.split(w, 3))


def _qkv_bias(b, heads):
    return tuple(part.reshape(heads, -1) for part in np.split(b, 3))


def _q_kernel(w, heads):  # Linear (heads * head_dim, D) -> (D, heads, head_dim)
    return w.T.reshape(w.shape[1], heads, -1)


def _kv_kernel(w, heads):  # rows [key; value] -> two (D, heads, head_dim)
    return tuple(_q_kernel(part, heads) for part in np.split(w, 2))


def _q_bias(b, heads):
    return b.reshape(heads, -1)


def _kv_bias(b, heads):
    return tuple(part.reshape(heads, -1) for part in np.split(b, 2))


def _out_kernel(w, heads):  # (D_out, heads * head_dim) -> (heads, head_dim, D_out)
    return w.T.reshape(heads, -1, w.shape[0])


def _same(array, heads):
    return array


_MAP_ATTENTION = "MAPHead_0/MultiHeadDotProductAttention_0/"
_QKV = tuple(_ATTENTION + f"{part}/{{kind}}" for part in ("query", "key", "value"))

# (timm name, official key(s), transform): one row per weight.
RULES = (
    ("patch_embed.proj.weight", "embedding/kernel", _conv_kernel),
    ("patch_embed.proj.bias", "embedding/bias", _same),
    ("cls_token", "cls", _same),
    # keras_vit extension keys: DeiT's distillation token and its head.
    ("dist_token", "dist", _same),
    ("head_dist.weight", "head_dist/kernel", _dense_kernel),
    ("head_dist.bias", "head_dist/bias", _same),
    # keras_vit extension key: register tokens.
    ("reg_token", "reg", _same),
    ("pos_embed", "Transformer/posembed_input/pos_embedding", _same),
    # keras_vit extension keys: the later families' pre-norm, patch norm, q/k norms and LayerScale.
    ("norm_pre.weight", "Transformer/norm_pre/scale", _same),
    ("norm_pre.bias", "Transformer/norm_pre/bias", _same),
    ("patch_embed.norm.weight", "embedding_norm/scale", _same),
    ("patch_embed.norm.bias", "embedding_norm/bias", _same),
    ("blocks.{i}.attn.q_norm.weight", _ATTENTION + "query_norm/scale", _same),
    ("blocks.{i}.attn.q_norm.bias", _ATTENTION + "query_norm/bias", _same),
    ("blocks.{i}.attn.k_norm.weight", _ATTENTION + "key_norm/scale", _same),
    ("blocks.{i}.attn.k_norm.bias", _ATTENTION + "key_norm/bias", _same),
    ("blocks.{i}.ls1.gamma", _BLOCK + "LayerScale_1/scale", _same),
    ("blocks.{i}.ls2.gamma", _BLOCK + "LayerScale_2/scale", _same),
    ("blocks.{i}.norm1.weight", _BLOCK + "LayerNorm_0/scale", _same),
    ("blocks.{i}.norm1.bias", _BLOCK + "LayerNorm_0/bias", _same),
    ("blocks.{i}.attn.qkv.weight", tuple(k.replace("{kind}", "kernel") for k in _QKV), _qkv_kernel),
    ("blocks.{i}.attn.qkv.bias", tuple(k.replace("{kind}", "bias") for k in _QKV), _qkv_bias),
    ("blocks.{i}.attn.proj.weight", _ATTENTION + "out/kernel", _out_kernel),
    ("blocks.{i}.attn.proj.bias", _ATTENTION + "out/bias", _same),
    ("blocks.{i}.norm2.weight", _BLOCK + "LayerNorm_2/scale", _same),
    ("blocks.{i}.norm2.bias", _BLOCK + "LayerNorm_2/bias", _same),
    ("blocks.{i}.mlp.fc1.weight", _MLP + "Dense_0/kernel", _dense_kernel),
    ("blocks.{i}.mlp.fc1.bias", _MLP + "Dense_0/bias", _same),
    ("blocks.{i}.mlp.fc2.weight", _MLP + "Dense_1/kernel", _dense_kernel),
    ("blocks.{i}.mlp.fc2.bias", _MLP + "Dense_1/bias", _same),
    ("norm.weight", "Transformer/encoder_norm/scale", _same),
    ("norm.bias", "Transformer/encoder_norm/bias", _same),
    # keras_vit extension keys: timm's LayerNorm after pooling.
    ("fc_norm.weight", "fc_norm/scale", _same),
    ("fc_norm.bias", "fc_norm/bias", _same),
    # AttentionPoolLatent (global_pool='map'): big_vision's MAPHead_0 keys.
    ("attn_pool.latent", "MAPHead_0/probe", _same),
    ("attn_pool.q.weight", _MAP_ATTENTION + "query/kernel", _q_kernel),
    ("attn_pool.q.bias", _MAP_ATTENTION + "query/bias", _q_bias),
    ("attn_pool.kv.weight", (_MAP_ATTENTION + "key/kernel", _MAP_ATTENTION + "value/kernel"), _kv_kernel),
    ("attn_pool.kv.bias", (_MAP_ATTENTION + "key/bias", _MAP_ATTENTION + "value/bias"), _kv_bias),
    ("attn_pool.proj.weight", _MAP_ATTENTION + "out/kernel", _out_kernel),
    ("attn_pool.proj.bias", _MAP_ATTENTION + "out/bias", _same),
    ("attn_pool.norm.weight", "MAPHead_0/LayerNorm_0/scale", _same),
    ("attn_pool.norm.bias", "MAPHead_0/LayerNorm_0/bias", _same),
    ("attn_pool.mlp.fc1.weight", "MAPHead_0/MlpBlock_0/Dense_0/kernel", _dense_kernel),
    ("attn_pool.mlp.fc1.bias", "MAPHead_0/MlpBlock_0/Dense_0/bias", _same),
    ("attn_pool.mlp.fc2.weight", "MAPHead_0/MlpBlock_0/Dense_1/kernel", _dense_kernel),
    ("attn_pool.mlp.fc2.bias", "MAPHead_0/MlpBlock_0/Dense_1/bias", _same),
    # Older timm ImageNet-21k files: the official representation layer.
    ("pre_logits.fc.weight", "pre_logits/kernel", _dense_kernel),
    ("pre_logits.fc.bias", "pre_logits/bias", _same),
    ("head.weight", "head/kernel", _dense_kernel),
    ("head.bias", "head/bias", _same),
)


def _norm_shapes(name, width, config):
    """A norm's weights: LayerNorm's weight and bias, RMSNorm's weight alone."""
    return {f"{name}.weight": (width,), **({f"{name}.bias": (width,)} if config.norm_layer == "layer_norm" else {})}


def _expected_shapes(config, proj_bias=True):
    """`{timm name: shape}` of every weight a timm model of `config` has (`proj_bias`: timm's, AIMv2's False)."""
    width, mlp, (ph, pw) = config.hidden_size, config.mlp_dim, config.patch_size
    shapes = {"patch_embed.proj.weight": (width, config.channels, ph, pw)}
    if config.patch_bias:
        shapes["patch_embed.proj.bias"] = (width,)
    if config.patch_norm:
        shapes.update(_norm_shapes("patch_embed.norm", width, config))
    if config.norm_pre:
        shapes.update(_norm_shapes("norm_pre", width, config))
    if config.class_token:
        shapes["cls_token"] = (1, 1, width)
    if config.distilled:
        shapes["dist_token"] = (1, 1, width)
    if config.num_register_tokens:
        shapes["reg_token"] = (1, config.num_register_tokens, width)
    if config.position_embedding == "learned_1d":
        prefix = 0 if config.no_embed_class else config.num_prefix_tokens
        shapes["pos_embed"] = (1, math.prod(config.grid_size) + prefix, width)
    fc1 = 2 * mlp if config.gated_mlp else mlp
    block = {**_norm_shapes("norm1", width, config), "attn.qkv.weight": (3 * width, width),
             "attn.proj.weight": (width, width), **_norm_shapes("norm2", width, config),
             "mlp.fc1.weight": (fc1, width), "mlp.fc2.weight": (width, mlp)}
    if config.qkv_bias == "all":
        block["attn.qkv.bias"] = (3 * width,)
    if proj_bias:
        block.update({"attn.proj.bias": (width,), "mlp.fc1.bias": (fc1,), "mlp.fc2.bias": (width,)})
    if config.qk_norm:
        head_dim = width // config.num_heads
        block.update({**_norm_shapes("attn.q_norm", head_dim, config), **_norm_shapes("attn.k_norm", head_dim, config)})
    if config.layer_scale_init is not None:
        block.update({"ls1.gamma": (width,), "ls2.gamma": (width,)})
    shapes.update({f"blocks.{i}.{name}": shape for i in range(config.num_layers) for name, shape in block.items()})
    shapes.update(_norm_shapes("fc_norm" if config.fc_norm else "norm", width, config))
    if config.classifier == "map":  # AttentionPoolLatent: one latent, q and kv projections, norm, MLP
        shapes.update({"attn_pool.latent": (1, 1, width), "attn_pool.q.weight": (width, width),
                       "attn_pool.q.bias": (width,), "attn_pool.kv.weight": (2 * width, width),
                       "attn_pool.kv.bias": (2 * width,), "attn_pool.proj.weight": (width, width),
                       "attn_pool.proj.bias": (width,), "attn_pool.norm.weight": (width,),
                       "attn_pool.norm.bias": (width,), "attn_pool.mlp.fc1.weight": (mlp, width),
                       "attn_pool.mlp.fc1.bias": (mlp,), "attn_pool.mlp.fc2.weight": (width, mlp),
                       "attn_pool.mlp.fc2.bias": (width,)})
    features = width
    if config.representation_size:
        features = config.representation_size
        shapes.update({"pre_logits.fc.weight": (features, width), "pre_logits.fc.bias": (features,)})
    for head in ("head", "head_dist") if config.distilled else ("head",):
        if config.classes:
            shapes.update({f"{head}.weight": (config.classes, features), f"{head}.bias": (config.classes,)})
    return shapes


def _check_names_and_shapes(tensors, config, source, proj_bias=True):
    """One error listing missing and unexpected weights and shape mismatches (expected vs the file's)."""
    expected = _expected_shapes(config, proj_bias)
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    mismatched = {name: (expected[name], tuple(tensors[name].shape)) for name in sorted(set(expected) & set(tensors))
                  if tuple(tensors[name].shape) != expected[name]}
    if missing or unexpected or mismatched:
        raise ValueError(
            f"{source} does not match the timm ViT its configuration describes; missing weights: {missing}; "
            f"unknown weights: {unexpected}; shape mismatches (expected, found): {mismatched}"
        )


def _to_official(tensors, config, source):
    """`{official key: array}` of every timm weight; anything unknown has raised before.

    A model without projection biases (AIMv2's proj_bias=False) gets zero ones: keras_vit's attention output and
    MLP always have a bias, and a zero bias computes the same function.
    """
    proj_bias = "blocks.0.attn.proj.bias" in tensors
    _check_names_and_shapes(tensors, config, source, proj_bias)
    if not proj_bias:
        fc1 = tensors["blocks.0.mlp.fc1.weight"].shape[0]
        tensors = {**tensors, **{f"blocks.{i}.{name}": np.zeros(size, np.float32) for i in range(config.num_layers)
                                 for name, size in (("attn.proj.bias", config.hidden_size), ("mlp.fc1.bias", fc1),
                                                    ("mlp.fc2.bias", config.hidden_size))}}
    arrays = {}
    for name, keys, transform in RULES:
        for i in range(config.num_layers) if "{i}" in name else (None,):
            array = tensors.get(name.format(i=i))
            if array is None:
                continue
            converted = transform(array, config.num_heads)
            for key, value in zip((keys,) if isinstance(keys, str) else keys,
                                  (converted,) if isinstance(keys, str) else converted, strict=True):
                arrays[key.format(i)] = np.ascontiguousarray(value)
    return arrays


# ------------------------------------------------------------------ writing
def _heads_first(kernel):  # (D, heads, head_dim) -> Linear (heads * head_dim, D)
    return kernel.reshape(kernel.shape[0], -1).T


# Each reading transform's inverse: the official arrays (one, or a tuple of parts) to the timm tensor.
_INVERSES = {
    _conv_kernel: lambda a: a.transpose(3, 2, 0, 1),
    _dense_kernel: lambda a: a.T,
    _qkv_kernel: lambda parts: np.concatenate([_heads_first(p) for p in parts]),
    _kv_kernel: lambda parts: np.concatenate([_heads_first(p) for p in parts]),
    _q_kernel: _heads_first,
    _qkv_bias: lambda parts: np.concatenate([p.reshape(-1) for p in parts]),
    _kv_bias: lambda parts: np.concatenate([p.reshape(-1) for p in parts]),
    _q_bias: lambda a: a.reshape(-1),
    _out_kernel: lambda a: a.reshape(-1, a.shape[-1]).T,
    _same: lambda a: a,
}
_WRITTEN_POOLS = {classifier: pool for pool, classifier in _POOLS.items()}


def write(model, directory):
    """Writes a keras_vit model as timm's Hugging Face layout: `model.safetensors` and the `config.json` of
    `timm.models.save_for_hf`, every architecture argument in `model_args`, so timm builds it with
    `timm.create_model(architecture, **model_args)` and loads the file with the same outputs.

    Raises:
        ValueError: naming each field timm's `VisionTransformer` has no counterpart for.
    """
    from keras_vit.checkpoints.files import refuse_non_empty_directory
    from keras_vit.checkpoints.official import entries, non_finite_keys, non_finite_message, official_key
    from keras_vit.checkpoints.safetensors import write_safetensors

    config = getattr(model, "vit_config", None)
    if config is None:
        raise ValueError(f"The model {model.name!r} carries no ViTConfig; build it with keras_vit.ViT")
    problems = [f"{name}={getattr(config, name)!r} (timm: {value!r})" for name, value in (
        ("representation_size", None), ("resnet_num_layers", None), ("projection_dim", None))
        if getattr(config, name) != value]
    if config.classifier == "token_and_gap":
        problems.append("classifier='token_and_gap' (timm: 'token', 'gap' or 'map')")
    if config.position_embedding not in ("learned_1d", "none"):
        problems.append(f"position_embedding={config.position_embedding!r} (timm: 'learned_1d' or 'none')")
    if config.qkv_bias == "qv":
        problems.append("qkv_bias='qv' (timm's VisionTransformer: 'all' or 'none')")
    if config.norm_pre == config.patch_bias:  # timm's pre_norm drops the patch bias, and only it
        problems.append(f"norm_pre={config.norm_pre} with patch_bias={config.patch_bias} (timm: pre_norm=True "
                        "without a patch bias, or neither)")
    architecture, why = _written_architecture(config)
    if why:
        problems.append(why)
    if problems:
        raise ValueError("timm's VisionTransformer cannot represent this model: " + "; ".join(problems))
    refuse_non_empty_directory(directory, "A timm model directory")
    arrays = {}
    for path_in_model, weight, block in entries(model):
        value = np.asarray(weight.numpy(), np.float32)
        arrays[official_key(path_in_model)[0]] = value if block is None else value[block]
    bad = non_finite_keys(arrays)
    if bad:
        raise ValueError(non_finite_message(bad, f"The model {model.name!r}") + f"; nothing was written to {directory}")
    tensors = {}
    for name, keys, transform in RULES:
        for i in range(config.num_layers) if "{i}" in name else (None,):
            parts = tuple(key.format(i) for key in ((keys,) if isinstance(keys, str) else keys))
            if all(part in arrays for part in parts):
                value = arrays[parts[0]] if isinstance(keys, str) else tuple(arrays[p] for p in parts)
                tensors[name.format(i=i)] = np.ascontiguousarray(_INVERSES[transform](value))
    if architecture.startswith("aimv2"):  # timm's SwiGLU holds the gate and the value apart
        tensors = _split_swiglu(tensors)
    # Projection biases all zero are written as none (timm's proj_bias=False, AIMv2's): the same function, and
    # an AIMv2 file read and written again is the file it was.
    biases = [n for n in tensors if re.fullmatch(r"blocks\.\d+\.(attn\.proj|mlp\.fc1(_[gx])?|mlp\.fc2)\.bias", n)]
    proj_bias = any(np.any(tensors[n]) for n in biases)
    if not proj_bias:
        tensors = {n: t for n, t in tensors.items() if n not in biases}
    os.makedirs(directory, exist_ok=True)
    write_safetensors(os.path.join(directory, "model.safetensors"), tensors)
    with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as f:
        json.dump(_written_config(config, proj_bias), f, indent=2, sort_keys=True)
        f.write("\n")
    return directory


def _split_swiglu(tensors):
    """The inverse of `_packed_swiglu`: each packed `fc1` as `fc1_g` (its first half, the gate) and `fc1_x`."""
    split = dict(tensors)
    for name in [n for n in tensors if re.fullmatch(r"blocks\.\d+\.mlp\.fc1\.(weight|bias)", n)]:
        gate, value = np.split(split.pop(name), 2)
        split[name.replace(".fc1.", ".fc1_g.")], split[name.replace(".fc1.", ".fc1_x.")] = gate, value
    return split


# timm architectures whose layer classes keras_vit's norms and MLPs need beyond model_args' reach, and what each
# fixes: (norm_layer, epsilon, gated MLP, patch norm). model_args set everything else.
_WRITTEN_ARCHITECTURES = {
    ("layer_norm", 1e-6, False, False): "vit_base_patch16_224",
    ("rms_norm", 1e-6, False, False): "vit_base_patch16_224",  # model_args norm_layer='rmsnorm'
    ("layer_norm", 1e-5, False, False): "vit_base_patch16_clip_224",  # its LayerNorm eps 1e-5
    ("layer_norm", 1e-6, True, False): "vit_giant_patch14_dinov2",  # SwiGLUPacked (GluMlp, gate first)
    ("rms_norm", 1e-5, True, True): "aimv2_large_patch14_224",  # RmsNorm 1e-5, SwiGLU, patch_embed norm
}


def _written_architecture(config):
    """`(timm architecture, None)` whose layer classes compute `config`'s norms and MLP, or `(None, why not)`."""
    key = (config.norm_layer, config.layer_norm_epsilon, config.gated_mlp, config.patch_norm)
    architecture = _WRITTEN_ARCHITECTURES.get(key)
    if config.distilled:  # deit.py's VisionTransformerDistilled; its own arguments are VisionTransformer's
        architecture = "deit_base_distilled_patch16_224" if architecture == "vit_base_patch16_224" else None
    if architecture is None:
        return None, (f"norm_layer={config.norm_layer!r} at layer_norm_epsilon={config.layer_norm_epsilon}, "
                      f"gated_mlp={config.gated_mlp}, patch_norm={config.patch_norm}, distilled={config.distilled} "
                      f"(timm builds {sorted(_WRITTEN_ARCHITECTURES)} without distillation; DeiT's distilled model "
                      "a LayerNorm or RMSNorm at 1e-6 with a plain MLP)")
    return architecture, None


def _mlp_ratio(width, hidden):
    """An mlp_ratio whose `int(width * mlp_ratio)` (timm's rounding) is `hidden`: the quotient, or nudged up."""
    ratio = hidden / width
    return ratio if int(width * ratio) == hidden else (hidden + 0.5) / width


def _written_config(config, proj_bias=True):
    """timm's `config.json`: the architecture, every argument in `model_args`, mean and std in `pretrained_cfg`."""
    size = list(config.image_size)
    architecture, _ = _written_architecture(config)
    args = dict(
        img_size=size, patch_size=list(config.patch_size), in_chans=config.channels, embed_dim=config.hidden_size,
        depth=config.num_layers, num_heads=config.num_heads,
        # timm's Block makes fc1 int(width * mlp_ratio) wide, twice the gated width for SwiGLUPacked.
        mlp_ratio=_mlp_ratio(config.hidden_size, config.mlp_dim * (2 if architecture.endswith("dinov2") else 1)),
        num_classes=config.classes, global_pool=_WRITTEN_POOLS[config.classifier], class_token=config.class_token,
        no_embed_class=config.no_embed_class, fc_norm=config.fc_norm, reg_tokens=config.num_register_tokens,
        pos_embed="learn" if config.position_embedding == "learned_1d" else "none",
        dynamic_img_size=config.dynamic_image_size,
        # The later families' blocks; each overrides what a family architecture would set.
        init_values=config.layer_scale_init, pre_norm=config.norm_pre, qkv_bias=config.qkv_bias == "all",
        qk_norm=config.qk_norm, proj_bias=proj_bias,
    )
    if config.norm_layer == "rms_norm" and not config.patch_norm:
        args["norm_layer"] = "rmsnorm"
    args["act_layer"] = {"quick_gelu": "quick_gelu", "silu": "silu"}.get(
        config.activation, "gelu_tanh" if config.gelu_approximate else "gelu")
    if config.distilled:
        del args["reg_tokens"]
    return dict(
        architecture=architecture, num_classes=config.classes, num_features=config.hidden_size,
        global_pool=args["global_pool"], model_args=args,
        pretrained_cfg=dict(input_size=[config.channels, *size], fixed_input_size=not config.dynamic_image_size,
                            interpolation="bicubic", crop_pct=1.0, crop_mode="center",
                            mean=list(config.input_mean), std=list(config.input_std), num_classes=config.classes,
                            first_conv="patch_embed.proj",
                            classifier=["head", "head_dist"] if config.distilled else "head"),
    )
