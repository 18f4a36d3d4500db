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

timm's `Eva` class (EVA02, DINOv3, Naver's RoPE-ViT, the SBB RoPE ViTs) is
read the same way, its architecture looked up in `EVA_ARCHITECTURES` (its
config.json leaves the rotary settings to the name): fused or separate q/k/v
with EVA's query and value biases (`qkv_bias="qv"`), gammas as LayerScale,
SwiGLU with its sub-LN (`mlp_norm`), the attention's norm (`attention_norm`)
and RoPE-Mixed's learned frequencies. `write` writes a model with rotary
positions back as an Eva.
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
from keras_vit.positions import rotary
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

# timm's `Eva` class (models/eva.py, timm 1.0.31): EVA02, DINOv3, Naver's RoPE-ViT and the SBB RoPE ViTs, each
# name with the arguments its builder passes to `_create_eva`, in timm's words (its `norm_layer` as `norm_eps`: all
# are LayerNorms). Their config.json holds only what create_model was given, not the RoPE settings: those come from
# here. tests/fixtures/rope/architectures.json holds what each builder passes; a test compares.
_EVA02 = dict(mlp_ratio=4 * 2 / 3, swiglu_mlp=True, use_rot_pos_emb=True, ref_feat_shape=(16, 16))
_EVA02_SPLIT = dict(_EVA02, qkv_fused=False, scale_mlp=True)  # q/k/v projections, SwiGLU with its sub-LN
_EVA02_SIZES = {"tiny": (192, 12, 3), "small": (384, 12, 6), "base": (768, 12, 12), "large": (1024, 24, 16)}
_NAVER = dict(attn_type="rope", class_token=True, global_pool="token", init_values=1e-5, mlp_ratio=4, qkv_bias=True,
              rope_grid_indexing="xy", use_rot_pos_emb=True, patch_size=16)
_NAVER_KINDS = {"": dict(rope_temperature=100.0, use_abs_pos_emb=False),
                "ape_": dict(rope_temperature=100.0, use_abs_pos_emb=True, no_embed_class=True),
                "mixed_": dict(rope_temperature=10.0, rope_type="mixed", use_abs_pos_emb=False),
                "mixed_ape_": dict(rope_temperature=10.0, rope_type="mixed", use_abs_pos_emb=True, no_embed_class=True)}
_DINOV3 = dict(dynamic_img_size=True, init_values=1e-5, norm_eps=1e-5, num_reg_tokens=4, patch_size=16,
               rope_rotate_half=True, rope_temperature=100, rope_type="dinov3", use_abs_pos_emb=False,
               use_fc_norm=False, use_rot_pos_emb=True)
_DINOV3_SIZES = {"tiny": (192, 12, 3, {}), "small": (384, 12, 6, {}), "base": (768, 12, 12, {}),
                 "large": (1024, 24, 16, {}), "small_plus": (384, 12, 6, dict(swiglu_mlp=True, swiglu_align_to=8)),
                 "huge_plus": (1280, 32, 20, dict(swiglu_mlp=True, swiglu_align_to=8)),
                 "7b": (4096, 40, 32, dict(mlp_ratio=2, swiglu_mlp=True, swiglu_align_to=64))}


def _eva_sized(width, depth, heads, **extra):
    return dict(embed_dim=width, depth=depth, num_heads=heads, **extra)


EVA_ARCHITECTURES = {
    **{f"eva02_{size}_patch14_{r}": _eva_sized(*_EVA02_SIZES[size], img_size=r, patch_size=14,
                                               **(_EVA02 if size in ("tiny", "small") else _EVA02_SPLIT))
       for size, rs in (("tiny", (224, 336)), ("small", (224, 336)), ("base", (224, 448)), ("large", (224, 448)))
       for r in rs},
    **{f"eva02_{name}_clip_{r}": _eva_sized(*_EVA02_SIZES[size], img_size=r, patch_size=patch, global_pool="token",
                                            scale_attn_inner=True, **_EVA02_SPLIT)
       for name, size, patch, r in (("base_patch16", "base", 16, 224), ("large_patch14", "large", 14, 224),
                                    ("large_patch14", "large", 14, 336))},
    # No RoPE and a post-norm block (EvaBlockPostNorm): listed to be refused by name.
    "eva02_enormous_patch14_clip_224": _eva_sized(1792, 64, 16, img_size=224, patch_size=14, mlp_ratio=15360 / 1792,
                                                  global_pool="token", use_post_norm=True),
    **{f"vit_{size}_patch16_rope_reg{reg}_gap_256": _eva_sized(
        width, depth, heads, img_size=256, patch_size=16, init_values=1e-5, class_token=False, num_reg_tokens=reg,
        qkv_bias=bias, qkv_fused=True, ref_feat_shape=(16, 16), use_abs_pos_emb=False, use_rot_pos_emb=True)
       for size, width, depth, heads, bias, reg in (("medium", 512, 12, 8, True, 1), ("mediumd", 512, 20, 8, False, 1),
                                                    ("betwixt", 640, 12, 10, True, 4), ("base", 768, 12, 12, True, 1))},
    **{f"vit_{size}_patch16_rope_{kind}224": _eva_sized(
        *_EVA02_SIZES[size], **_NAVER, **args, **({"use_fc_norm": False} if (size, kind) == ("base", "") else {}))
       for size in ("small", "base", "large") for kind, args in _NAVER_KINDS.items()},
    **{f"vit_{size}_patch16_dinov3{tail}": _eva_sized(width, depth, heads, **_DINOV3, **extra, qkv_bias=tail == "_qkvb")
       for size, (width, depth, heads, extra) in _DINOV3_SIZES.items() for tail in ("", "_qkvb")
       if not (tail == "" and size == "tiny") and not (tail == "_qkvb" and size == "7b")},
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
    tensors = read_safetensors(weights_path)
    if config_path is not None:
        cfg = _load_json(config_path)
        if cfg.get("architecture") in EVA_ARCHITECTURES:
            return _read_eva(tensors, cfg, config_path, weights_path, num_heads)
    else:
        _refuse_bare_eva(tensors, weights_path)
    tensors = _packed_swiglu(tensors)
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
    architecture = cfg.get("architecture")
    table = {**ARCHITECTURES, **REGISTER_AND_MAP_ARCHITECTURES, **FAMILY_ARCHITECTURES}
    if architecture not in table:
        raise ValueError(f"{source}: architecture {architecture!r} is not a timm ViT keras_vit reads; expected one "
                         f"of {len(table) + len(EVA_ARCHITECTURES)} names: the vit_*, deit_*, deit3_*, *_dinov2, "
                         "*_clip_*, aimv2_*, eva02_*, *_dinov3* and *_rope_* in docs/checkpoints.md")
    args, model_args = _stated_args(cfg, dict(table[architecture]), source)
    _check_model_args(model_args, source)
    args.update({k: v for k, v in model_args.items() if k in _READ_ARGS})
    return args


def _stated_args(cfg, args, source):
    """`(args, model_args)`: the architecture's `args` under pretrained_cfg's and the top level's (timm's order;
    model_args, last, are the caller's to check and apply)."""
    pretrained = cfg.get("pretrained_cfg") or cfg  # older files: one flat dict
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
    return args, cfg.get("model_args") or {}


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


# ------------------------------------------------------------ timm's Eva class
# Eva's arguments keras_vit reads (`_eva_fields`), those that only shape training or initialisation, and those it
# refuses at any value but the ones listed, with what they are.
_EVA_READ_ARGS = {"img_size", "patch_size", "in_chans", "num_classes", "global_pool", "embed_dim", "depth",
                  "num_heads", "qkv_bias", "qkv_fused", "qk_norm", "mlp_ratio", "swiglu_mlp", "swiglu_align_to",
                  "scale_mlp", "scale_attn_inner", "attn_type", "init_values", "class_token", "num_reg_tokens",
                  "no_embed_class", "use_abs_pos_emb", "use_rot_pos_emb", "rope_type", "rope_grid_offset",
                  "rope_grid_indexing", "rope_temperature", "rope_rotate_half", "use_pre_transformer_norm",
                  "use_post_transformer_norm", "use_fc_norm", "dynamic_img_size", "ref_feat_shape",
                  "drop_path_rate", "attn_drop_rate", "proj_drop_rate"}
_EVA_TRAINING_ARGS = {"drop_rate", "pos_drop_rate", "patch_drop_rate", "head_init_scale"}
_EVA_REFUSED = {
    "use_post_norm": ((False,), "a post-norm block (EvaBlockPostNorm: eva02_enormous_*), which keras_vit's pre-norm "
                                "blocks cannot compute"),
    "use_naflex": ((None, False), "NaFlex (timm then builds a NaFlexVit)"),
    "rope_shift_coords": ((None,), "a RoPE augmentation"), "rope_jitter_coords": ((None,), "a RoPE augmentation"),
    "rope_rescale_coords": ((None,), "a RoPE augmentation"), "rope_mrope_section": ((None,), "MRoPE"),
    "num_kv_heads": ((None,), "grouped-query attention"),
    "attn_only_layer_scale": ((False,), "LayerScale on the attention branch only"),
    "attn_pool_num_heads": ((None,), "attention pooling"), "attn_pool_mlp_ratio": ((None,), "attention pooling"),
    "dynamic_img_pad": ((False,), "padding of odd image sizes"),
}
# Weights only Eva checkpoints have: a bare file holding them is refused (its RoPE is in the architecture's name).
_EVA_WEIGHTS = r"blocks\.\d+\.(gamma_[12]|attn\.[qv]_bias|attn\.[qkv]_proj\.weight)|rope\.freqs"
_ROPE_TYPES = ("cat", "mixed", "dinov3")


def _refuse_bare_eva(tensors, source):
    found = sorted(name for name in tensors if re.fullmatch(_EVA_WEIGHTS, name))
    if found:
        raise ValueError(f"{source} holds timm Eva weights (EVA02, DINOv3, RoPE-ViT: {found[:3]}), whose rotary "
                         "positions only the architecture's name states; expected config.json beside the file (pass "
                         "the model directory)")


def _read_eva(tensors, cfg, source, weights_path, num_heads):
    """`(ViTConfig, arrays)` of a timm `Eva` checkpoint (EVA02, DINOv3, RoPE-ViT, the SBB RoPE ViTs)."""
    args = _eva_args(cfg, source)
    if num_heads is not None and num_heads != args["num_heads"]:
        raise ValueError(f"{source} says num_heads={args['num_heads']}; received num_heads={num_heads}")
    fields = _eva_fields(args, source)
    _check_eva_layout(tensors, args, weights_path)
    converted = _from_eva(tensors, args["num_heads"], weights_path)
    facts = _weight_facts(converted, weights_path)
    patch = to_pair(args.get("patch_size", 16), f"patch_size of {source}")
    pool = args.get("global_pool", "avg")
    stated = dict(hidden_size=args.get("embed_dim", 768), num_layers=args.get("depth", 12), patch_size=patch,
                  mlp_dim=fields["mlp_dim"], gated_mlp=fields["gated_mlp"], channels=args.get("in_chans", 3),
                  classes=args.get("num_classes", 1000), class_token=args.get("class_token", True),
                  fc_norm=fields.pop("fc_norm"), num_register_tokens=args.get("num_reg_tokens", 0),
                  distilled=False, map_head=False, representation_size=None, proj_bias=True)
    for name, value in stated.items():
        if value != facts[name]:
            raise ValueError(f"{source} says {name}={value!r} but the weights have {name}={facts[name]!r}")
    del fields["mlp_dim"]
    size = to_pair(args.get("img_size", 224), f"img_size of {source}")
    grid = tuple(s // p for s, p in zip(size, patch, strict=True))
    no_embed_class = bool(args.get("no_embed_class", False))
    _check_positions(facts, grid, no_embed_class, "learn" if args.get("use_abs_pos_emb", True) else "none", source)
    config = _make_config(weights_path, facts, num_heads=args["num_heads"], grid=grid, classifier=_POOLS[pool],
                          no_embed_class=no_embed_class, **fields, **_pretrained_fields(cfg), **_training_fields(args))
    return config, _to_official(converted, config, weights_path)


def _eva_args(cfg, source):
    """Eva's arguments: the builder's (EVA_ARCHITECTURES) < pretrained_cfg < top level < model_args."""
    args, model_args = _stated_args(cfg, dict(EVA_ARCHITECTURES[cfg["architecture"]]), source)
    unknown = sorted(set(model_args) - _EVA_READ_ARGS - _EVA_TRAINING_ARGS - set(_EVA_REFUSED))
    if unknown:
        raise ValueError(f"{source}: model_args {unknown} are unknown to keras_vit's reader of timm's Eva models; "
                         f"expected only {sorted(_EVA_READ_ARGS | _EVA_TRAINING_ARGS | set(_EVA_REFUSED))}")
    args.update(model_args)
    for name, (accepted, what) in _EVA_REFUSED.items():
        if args.get(name, accepted[0]) not in accepted:
            raise ValueError(f"{source}: {name}={args[name]!r} ({cfg['architecture']}) is {what}; keras_vit reads "
                             f"timm's Eva models with {name}={accepted[0]!r}")
    return args


def _eva_fields(args, source):
    """The ViTConfig fields of Eva's arguments (blocks, norms, pooling, RoPE), and the MLP's width."""
    width = args.get("embed_dim", 768)
    hidden = int(width * args.get("mlp_ratio", 4.0))  # EvaBlock's; GluMlp gets twice this, gate and value
    swiglu, scale_mlp, align = (bool(args.get("swiglu_mlp")), bool(args.get("scale_mlp")),
                                args.get("swiglu_align_to") or 0)
    if swiglu and align:  # SwiGLU rounds its width up
        hidden += -hidden % align
    pool = args.get("global_pool", "avg")
    if pool not in ("avg", "token"):
        raise ValueError(f"{source}: global_pool={pool!r}; keras_vit reads timm's Eva models pooled 'avg' (mean of "
                         "the patches) or 'token' (the class token)")
    fc_norm = pool == "avg" if args.get("use_fc_norm") is None else bool(args["use_fc_norm"])
    final_norm = not fc_norm if args.get("use_post_transformer_norm") is None else bool(
        args["use_post_transformer_norm"])
    if final_norm == fc_norm:
        raise ValueError(f"{source}: use_fc_norm={fc_norm} with use_post_transformer_norm={final_norm}; keras_vit "
                         "has one final norm, on the sequence or (fc_norm) on the pooled vector")
    if not args.get("qkv_bias", True):
        qkv_bias = "none"
    else:  # AttentionRope biases the key too; EvaAttention's key bias is a fixed zero
        qkv_bias = "all" if args.get("attn_type", "eva") == "rope" else "qv"
    if args.get("attn_type", "eva") not in ("eva", "rope"):
        raise ValueError(f"{source}: attn_type={args['attn_type']!r}; keras_vit reads Eva's 'eva' and 'rope'")
    pre_norm = bool(args.get("use_pre_transformer_norm", False))
    return dict(
        mlp_dim=hidden, gated_mlp=swiglu, activation="silu" if swiglu else "gelu", mlp_norm=scale_mlp,
        attention_norm=bool(args.get("scale_attn_inner", False)), qkv_bias=qkv_bias,
        qk_norm=bool(args.get("qk_norm", False)), layer_scale_init=args.get("init_values"),
        norm_pre=pre_norm, patch_bias=not pre_norm, layer_norm_epsilon=args.get("norm_eps", 1e-6), fc_norm=fc_norm,
        **_eva_rope(args, source),
    )


def _eva_rope(args, source):
    """rotary_embedding, rope_theta and rope_reference_grid of Eva's RoPE arguments (see `EVA_ARCHITECTURES`)."""
    if not args.get("use_rot_pos_emb", False):
        return {}
    rope_type, indexing = args.get("rope_type", "cat"), args.get("rope_grid_indexing", "ij")
    reference, rotate_half = args.get("ref_feat_shape"), bool(args.get("rope_rotate_half", False))
    stated = (f"rope_type={rope_type!r}, rope_grid_indexing={indexing!r}, ref_feat_shape={reference!r}, "
              f"rope_rotate_half={rotate_half}")
    kind = {("cat", "ij", True, False): "rope_eva", ("cat", "xy", False, False): "rope_axial",
            ("mixed", "xy", False, False): "rope_mixed", ("dinov3", "ij", False, True): "rope_dinov3"}.get(
        (rope_type, indexing, reference is not None and rope_type == "cat", rotate_half))
    if kind is None:
        raise ValueError(f"{source}: {stated}; keras_vit reads timm's rope_type {list(_ROPE_TYPES)} as EVA02 ('cat', "
                         "'ij', a ref_feat_shape), RoPE-ViT ('cat' or 'mixed', 'xy', none) and DINOv3 ('dinov3', "
                         "'ij', rope_rotate_half=True)")
    if args.get("rope_grid_offset", 0):
        raise ValueError(f"{source}: rope_grid_offset={args['rope_grid_offset']!r}; keras_vit's rotary positions "
                         "start at offset 0")
    theta = float(args.get("rope_temperature", 10000.0))
    return dict(rotary_embedding=kind, rope_theta=None if theta == rotary.THETAS[kind] else theta,
                rope_reference_grid=to_pair(reference, "ref_feat_shape") if kind == "rope_eva" else None)


def _check_eva_layout(tensors, args, source):
    """The file's attention and MLP layout must be the one Eva's arguments build."""
    fused, split = "blocks.0.attn.qkv.weight" in tensors, "blocks.0.mlp.fc1_g.weight" in tensors
    swiglu_split = bool(args.get("swiglu_mlp")) and bool(args.get("scale_mlp") or args.get("swiglu_align_to"))
    for what, stated, found in (("qkv_fused", bool(args.get("qkv_fused", True)), fused),
                                ("a SwiGLU with fc1_g / fc1_x", swiglu_split, split)):
        if stated != found:
            raise ValueError(f"{source}: the architecture's arguments give {what}={stated}, the weights {found} "
                             f"(e.g. {sorted(n for n in tensors if n.startswith('blocks.0.'))[:6]})")


def _from_eva(tensors, heads, source):
    """Eva's tensors under timm VisionTransformer's names and the extension ones of `RULES`: separate q/k/v
    projections fused, gammas as LayerScale, SwiGLU's fc1_g / fc1_x packed (gate first), `rope.freqs` split per
    block with rows (y, x)."""
    out = {}
    for name, value in tensors.items():
        name = re.sub(r"^(blocks\.\d+\.)gamma_([12])$", r"\1ls\2.gamma", name)
        if re.fullmatch(r"blocks\.\d+\.attn\.[qkv]_proj\.(weight|bias)", name):
            continue
        out[name] = value
    separate = (re.fullmatch(r"blocks\.(\d+)\.attn\.q_proj\.weight", name) for name in tensors)
    for i in sorted(int(m.group(1)) for m in separate if m):
        proj = {part: {kind: tensors.get(f"blocks.{i}.attn.{part}_proj.{kind}") for kind in ("weight", "bias")}
                for part in "qkv"}
        if any(proj[part]["weight"] is None for part in "qkv"):
            raise ValueError(f"{source}: block {i} has q_proj but not each of k_proj and v_proj")
        out[f"blocks.{i}.attn.qkv.weight"] = np.concatenate([proj[part]["weight"] for part in "qkv"])
        biases = {part: proj[part]["bias"] for part in "qkv" if proj[part]["bias"] is not None}
        if set(biases) == set("qkv"):  # AttentionRope's
            out[f"blocks.{i}.attn.qkv.bias"] = np.concatenate([biases[part] for part in "qkv"])
        else:  # EvaAttention's: q and v biased, or none (else the shapes' check names what is left)
            out.update({f"blocks.{i}.attn.{part}_bias": bias for part, bias in biases.items()})
    freqs = out.pop("rope.freqs", None)
    if freqs is not None:
        if freqs.ndim != 4 or freqs.shape[0] != 2:
            raise ValueError(f"{source}: rope.freqs has shape {freqs.shape}; expected (2, depth, heads, head_dim / 2)")
        for i in range(freqs.shape[1]):  # timm's index 0 turns by x (columns), 1 by y (rows)
            out[f"blocks.{i}.attn.rope_frequencies"] = np.stack([freqs[1, i], freqs[0, i]])
    return _packed_swiglu(out)


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
    # Eva's query and value biases (qkv_bias='qv'; the key's is a fixed zero).
    ("blocks.{i}.attn.q_bias", _ATTENTION + "query/bias", _q_bias),
    ("blocks.{i}.attn.v_bias", _ATTENTION + "value/bias", _q_bias),
    # keras_vit extension keys: Eva's norms inside attention and the MLP, RoPE-Mixed's frequencies of one block
    # (rows y, x: `rope.freqs` is split by `_from_eva`).
    ("blocks.{i}.attn.norm.weight", _ATTENTION + "out_norm/scale", _same),
    ("blocks.{i}.attn.norm.bias", _ATTENTION + "out_norm/bias", _same),
    ("blocks.{i}.mlp.norm.weight", _MLP + "norm/scale", _same),
    ("blocks.{i}.mlp.norm.bias", _MLP + "norm/bias", _same),
    ("blocks.{i}.attn.rope_frequencies", _ATTENTION + "rope_frequencies", _same),
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
    if config.qkv_bias == "qv":  # Eva's q_bias and v_bias; the key's is a fixed zero
        block.update({"attn.q_bias": (width,), "attn.v_bias": (width,)})
    if config.attention_norm:
        block.update(_norm_shapes("attn.norm", width, config))
    if config.mlp_norm:
        block.update(_norm_shapes("mlp.norm", mlp, config))
    if config.rotary_embedding == "rope_mixed":  # `rope.freqs` (2, depth, heads, head_dim / 2), per block
        block["attn.rope_frequencies"] = (2, config.num_heads, width // config.num_heads // 2)
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
    eva = config.rotary_embedding is not None  # timm's Eva class: EVA02, DINOv3, RoPE-ViT
    architecture, problems = _eva_architecture(config) if eva else _vit_architecture(config)
    if problems:
        raise ValueError(f"timm's {'Eva' if eva else 'VisionTransformer'} cannot represent this model: "
                         + "; ".join(problems))
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
        if name in ("blocks.{i}.attn.q_bias", "blocks.{i}.attn.v_bias") and config.qkv_bias != "qv":
            continue  # the query's and value's biases of qkv.bias
        for i in range(config.num_layers) if "{i}" in name else (None,):
            parts = tuple(key.format(i) for key in ((keys,) if isinstance(keys, str) else keys))
            if all(part in arrays for part in parts):
                value = arrays[parts[0]] if isinstance(keys, str) else tuple(arrays[p] for p in parts)
                tensors[name.format(i=i)] = np.ascontiguousarray(_INVERSES[transform](value))
    if eva:
        tensors, written = _to_eva(tensors, config), _written_eva_config(config, architecture)
    else:
        tensors, written = _vit_tensors_and_config(tensors, config, architecture)
    os.makedirs(directory, exist_ok=True)
    write_safetensors(os.path.join(directory, "model.safetensors"), tensors)
    with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as f:
        json.dump(written, f, indent=2, sort_keys=True)
        f.write("\n")
    return directory


def _vit_architecture(config):
    """`(architecture, problems)` of writing `config` as timm's VisionTransformer."""
    problems = [f"{name}={getattr(config, name)!r} (timm: {value!r})" for name, value in (
        ("representation_size", None), ("resnet_num_layers", None), ("projection_dim", None),
        ("attention_norm", False), ("mlp_norm", False)) if getattr(config, name) != value]
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
    return architecture, problems


def _vit_tensors_and_config(tensors, config, architecture):
    """VisionTransformer's tensors (of RULES' names) and config.json."""
    if architecture.startswith("aimv2"):  # timm's SwiGLU holds the gate and the value apart
        tensors = _split_swiglu(tensors)
    # Projection biases all zero are written as none (timm's proj_bias=False, AIMv2's): the same function, and
    # an AIMv2 file read and written again is the file it was.
    biases = [n for n in tensors if re.fullmatch(r"blocks\.\d+\.(attn\.proj|mlp\.fc1(_[gx])?|mlp\.fc2)\.bias", n)]
    proj_bias = any(np.any(tensors[n]) for n in biases)
    if not proj_bias:
        tensors = {n: t for n, t in tensors.items() if n not in biases}
    return tensors, _written_config(config, proj_bias)


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
    return _written(config, architecture, args)


def _written(config, architecture, args):
    """config.json of `architecture` built with `args`: timm's `save_for_hf` layout."""
    return dict(
        architecture=architecture, num_classes=config.classes, num_features=config.hidden_size,
        global_pool=args["global_pool"], model_args=args,
        pretrained_cfg=dict(input_size=[config.channels, *config.image_size],
                            fixed_input_size=not config.dynamic_image_size, interpolation="bicubic", crop_pct=1.0,
                            crop_mode="center", mean=list(config.input_mean), std=list(config.input_std),
                            num_classes=config.classes, first_conv="patch_embed.proj",
                            classifier=["head", "head_dist"] if config.distilled else "head"),
    )


# timm's Eva architectures keras_vit writes, by rotary kind and epsilon (each's LayerNorm is the one thing
# model_args cannot set); every other argument is in model_args.
_WRITTEN_EVA = {("rope_eva", 1e-6): "eva02_base_patch14_224", ("rope_axial", 1e-6): "vit_base_patch16_rope_224",
                ("rope_mixed", 1e-6): "vit_base_patch16_rope_mixed_224",
                ("rope_dinov3", 1e-5): "vit_base_patch16_dinov3"}
_WRITTEN_EVA_BY_EPS = {1e-6: "eva02_base_patch14_224", 1e-5: "vit_base_patch16_dinov3"}
_ROPE_ARGS = {"rope_eva": ("cat", "ij"), "rope_axial": ("cat", "xy"), "rope_mixed": ("mixed", "xy"),
              "rope_dinov3": ("dinov3", "ij")}


def _eva_architecture(config):
    """`(architecture, problems)` of writing `config` (with rotary positions) as timm's Eva."""
    problems = [f"{name}={getattr(config, name)!r} (timm's Eva: {value!r})" for name, value in (
        ("representation_size", None), ("resnet_num_layers", None), ("projection_dim", None), ("distilled", False),
        ("norm_layer", "layer_norm"), ("patch_norm", False)) if getattr(config, name) != value]
    if config.classifier not in ("token", "gap"):
        problems.append(f"classifier={config.classifier!r} (timm's Eva: 'token' or 'gap')")
    if config.position_embedding not in ("learned_1d", "none"):
        problems.append(f"position_embedding={config.position_embedding!r} (timm's Eva: 'learned_1d' or 'none')")
    if config.norm_pre == config.patch_bias:  # Eva's use_pre_transformer_norm drops the patch bias, and only it
        problems.append(f"norm_pre={config.norm_pre} with patch_bias={config.patch_bias} (timm's Eva: "
                        "use_pre_transformer_norm=True without a patch bias, or neither)")
    if (config.activation, config.gelu_approximate) != (("silu", False) if config.gated_mlp else ("gelu", False)):
        problems.append(f"activation={config.activation!r} with gelu_approximate={config.gelu_approximate} and "
                        f"gated_mlp={config.gated_mlp} (timm's Eva: SwiGLU, or an MLP with exact GELU)")
    eps = config.layer_norm_epsilon
    architecture = _WRITTEN_EVA.get((config.rotary_embedding, eps)) or _WRITTEN_EVA_BY_EPS.get(eps)
    if architecture is None:
        problems.append(f"layer_norm_epsilon={eps} (timm's Eva builders: {sorted(_WRITTEN_EVA_BY_EPS)})")
    return architecture, problems


def _split_eva_mlp(config):
    """Whether timm's Eva holds `config`'s gated MLP as SwiGLU's fc1_g / fc1_x (with EVA02's sub-LN, or DINOv3's
    aligned width) rather than GluMlp's packed fc1 (EVA02 tiny and small), as timm's registered models do."""
    return config.gated_mlp and (config.mlp_norm or config.rotary_embedding == "rope_dinov3")


def _to_eva(tensors, config):
    """The inverse of `_from_eva`: q/k/v projections apart where timm's registered models have them (with the
    MLP's sub-LN: EVA02 base, large, CLIP), gammas, SwiGLU's halves, one `rope.freqs` (2, depth, heads, hd / 2)."""
    separate = config.mlp_norm
    out, frequencies = {}, {}
    for name, value in tensors.items():
        match = re.fullmatch(r"(blocks\.(\d+)\.)(.*)", name)
        prefix, rest = (match.group(1), match.group(3)) if match else ("", name)
        if rest in ("ls1.gamma", "ls2.gamma"):
            out[f"{prefix}gamma_{rest[2]}"] = value
        elif rest == "attn.rope_frequencies":
            frequencies[int(match.group(2))] = value
        elif separate and rest in ("attn.qkv.weight", "attn.qkv.bias"):
            for part, piece in zip("qkv", np.split(value, 3), strict=True):
                out[f"{prefix}attn.{part}_proj.{rest.rpartition('.')[2]}"] = piece
        elif separate and rest in ("attn.q_bias", "attn.v_bias"):
            out[f"{prefix}attn.{rest[5]}_proj.bias"] = value
        else:
            out[name] = value
    if frequencies:  # timm's index 0 turns by x (columns), 1 by y (rows)
        blocks = [frequencies[i] for i in range(config.num_layers)]
        out["rope.freqs"] = np.stack([np.stack([f[1] for f in blocks]), np.stack([f[0] for f in blocks])])
    return _split_swiglu(out) if _split_eva_mlp(config) else out


def _written_eva_config(config, architecture):
    """timm's `config.json` of an Eva model: `architecture` for its LayerNorm, every other argument in
    `model_args` (the RoPE settings included, which timm's own files leave to the name)."""
    kind = config.rotary_embedding
    rope_type, indexing = _ROPE_ARGS[kind]
    split = _split_eva_mlp(config)
    args = dict(
        img_size=list(config.image_size), patch_size=list(config.patch_size), in_chans=config.channels,
        embed_dim=config.hidden_size, depth=config.num_layers, num_heads=config.num_heads,
        mlp_ratio=_mlp_ratio(config.hidden_size, config.mlp_dim), num_classes=config.classes,
        global_pool=_WRITTEN_POOLS[config.classifier], class_token=config.class_token,
        num_reg_tokens=config.num_register_tokens, no_embed_class=config.no_embed_class,
        use_abs_pos_emb=config.position_embedding == "learned_1d", qkv_bias=config.qkv_bias != "none",
        qkv_fused=not config.mlp_norm, attn_type="rope" if config.qkv_bias == "all" else "eva",
        qk_norm=config.qk_norm, swiglu_mlp=config.gated_mlp,
        # SwiGLU (split) without its norm only where an alignment is set; 1 keeps the width.
        swiglu_align_to=1 if split and not config.mlp_norm else 0, scale_mlp=config.mlp_norm,
        scale_attn_inner=config.attention_norm, init_values=config.layer_scale_init,
        use_pre_transformer_norm=config.norm_pre, use_fc_norm=config.fc_norm,
        dynamic_img_size=config.dynamic_image_size, use_rot_pos_emb=True, rope_type=rope_type,
        rope_temperature=rotary.THETAS[kind] if config.rope_theta is None else config.rope_theta,
        rope_grid_indexing=indexing, rope_rotate_half=kind == "rope_dinov3",
        ref_feat_shape=list(config.rope_reference_grid) if kind == "rope_eva" else None,
    )
    return _written(config, architecture, args)
