"""Hugging Face `transformers` model directories (ViT, DeiT, DINOv2, CLIP and SigLIP image towers), without torch.

A directory written by `save_pretrained` (`config.json` with its
`model_type`, `model.safetensors` or its shards, and usually the image
processor's `preprocessor_config.json`) holds one of

- `ViTForImageClassification` (`vit.*` + `classifier`): class-token pooling, head;
- `ViTModel` (no prefix, + `pooler.dense`): the pooler, dense + tanh on the
  class token, is keras_vit's `pre_logits` (`representation_size`), no head;
- `DeiTForImageClassificationWithTeacher` (`deit.*`, `cls_classifier`,
  `distillation_classifier`): keras_vit's `distilled=True`, the two heads'
  logits averaged as transformers does at inference; `DeiTModel` without its
  pooler;
- `Dinov2Model` ("dinov2"): LayerScale (`layer_scale{1,2}.lambda1`), and with
  `use_swiglu_ffn` the giant's SwiGLU (`mlp.weights_in` = [gate; up] rows:
  keras_vit's `gated_mlp` with SiLU); its `pooler_output`, the final-normed
  class token, is the model's output (`classifier="token"`);
  `Dinov2ForImageClassification` (`dinov2.*` + `classifier`) classifies
  concat(class token, mean of the patch tokens) (`"token_and_gap"`);
- `Dinov2WithRegistersModel` / `...ForImageClassification`
  ("dinov2_with_registers"): register tokens without positions beside a
  class token with one; read exactly as `no_embed_class=True` with the class
  row folded into the class token (cls + pos[0]: transformers never resizes
  that row);
- `CLIPVisionModel` / `CLIPVisionModelWithProjection` ("clip_vision_model"):
  a patch projection without bias, `pre_layrnorm` (`norm_pre`), QuickGELU,
  `post_layernorm` on the class token alone (`fc_norm=True`: the sequence,
  transformers' `last_hidden_state`, is before it), `visual_projection`
  (`projection_dim`: the output is `image_embeds`);
- `SiglipVisionModel` ("siglip_vision_model"): no class token,
  `post_layernorm` on the sequence, then the MAP head (`classifier="map"`;
  the packed `head.attention.in_proj_weight` split into query, key, value);
- `CLIPModel` / `SiglipModel` ("clip", "siglip"): their image tower
  (`vision_config`, `vision_model.*`, CLIP's `visual_projection`: the
  `image_embeds` of `get_image_features`); the text tower is not read;
- `DINOv3ViTModel` ("dinov3_vit"): rotary positions on patch centres in
  (-1, 1) (`rotary_embedding="rope_dinov3"`, `rope_theta`), no position
  table, so resolution-free (`dynamic_image_size=True`, as transformers',
  which takes the grid from every input); four registers after the class
  token, LayerScale, q/k/v biases as `query_bias` / `key_bias` /
  `value_bias` say (q and v without k: `qkv_bias="qv"`; a missing one of a
  kind keras_vit holds is a zero), the gated MLP of `use_gated_mlp`
  (`gate_proj`, `up_proj`: keras_vit's `gated_mlp`); its `pooler_output`, the
  final-normed class token, is the model's output (`classifier="token"`).
  On disk the blocks are `layer.{i}.*` (transformers 5 renames them
  `model.layer.{i}.*` in memory): both are read.

The image towers' names are read with and without `vision_model.`
(transformers 5 writes `CLIPVisionModel` and `SiglipVisionModel` without it,
older versions and the other classes with it).

Numerics come from the files: `hidden_act` ("gelu" is exact, "gelu_new" /
"gelu_pytorch_tanh" the tanh approximation, "quick_gelu", "silu"),
`layer_norm_eps` (the family's default without it), `image_mean` /
`image_std`. Position tables are resized as transformers resizes them:
PyTorch's bicubic without antialiasing (`interpolation="bicubic_no_antialias"`),
except Dinov2WithRegisters, which antialiases (`"bicubic"`, timm's rule).
What keras_vit cannot represent is refused by name (another activation, a
pooler on a DeiT, `DeiTForImageClassification`'s class-token-only head
beside a distillation token, masked-image-modelling decoders, a SigLIP tower
without its head, backbones). `pytorch_model.bin` is refused: a pickle can
run code when read. The labels (`id2label`) are read by `labels`. `write`
writes a keras_vit model back as the class of these that computes it (ViT,
DeiT, Dinov2 with or without registers and their classifiers, CLIPVisionModel
with or without projection, SiglipVisionModel, DINOv3ViTModel), by the reader's
tables turned around.
"""

import json
import logging
import math
import os
import re

import numpy as np

from keras_vit.checkpoints.safetensors import read_safetensors
from keras_vit.config import IMAGENET_MEAN, IMAGENET_STD, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, ViTConfig

DESCRIPTION = "a Hugging Face transformers ViT / DeiT / DINOv2 / DINOv3 / CLIP / SigLIP directory (save_pretrained)"
# model_type -> the model classes keras_vit reads of it.
FAMILIES = {
    "vit": ("ViTForImageClassification", "ViTModel"),
    "deit": ("DeiTForImageClassificationWithTeacher", "DeiTModel"),
    "dinov2": ("Dinov2Model", "Dinov2ForImageClassification"),
    "dinov2_with_registers": ("Dinov2WithRegistersModel", "Dinov2WithRegistersForImageClassification"),
    "clip_vision_model": ("CLIPVisionModel", "CLIPVisionModelWithProjection"),
    "siglip_vision_model": ("SiglipVisionModel",),
    "clip": ("CLIPModel",),
    "siglip": ("SiglipModel",),
    "dinov3_vit": ("DINOv3ViTModel",),
}
MODEL_TYPES = tuple(FAMILIES)
ARCHITECTURES = tuple(name for names in FAMILIES.values() for name in names)
# transformers' hidden_act (ACT2FN) -> keras_vit's activation fields.
ACTIVATIONS = {
    "gelu": dict(activation="gelu", gelu_approximate=False),
    "gelu_new": dict(activation="gelu", gelu_approximate=True),
    "gelu_pytorch_tanh": dict(activation="gelu", gelu_approximate=True),
    "quick_gelu": dict(activation="quick_gelu"),
    "silu": dict(activation="silu"),
    "swish": dict(activation="silu"),
}
_PREFIXES = {"vit": "vit.", "deit": "deit.", "dinov2": "dinov2.", "dinov2_with_registers": "dinov2_with_registers.",
             "clip_vision_model": "vision_model.", "siglip_vision_model": "vision_model."}
# Each family's config defaults (its transformers configuration class), for fields a config.json leaves out.
_DEFAULTS = {
    "vit": dict(hidden_size=768, intermediate_size=3072, num_attention_heads=12, num_hidden_layers=12,
                image_size=224, patch_size=16, layer_norm_eps=1e-12, hidden_act="gelu"),
    "dinov2": dict(hidden_size=768, num_attention_heads=12, num_hidden_layers=12, image_size=224, patch_size=14,
                   layer_norm_eps=1e-6, hidden_act="gelu", layerscale_value=1.0),
    "clip_vision_model": dict(hidden_size=768, num_attention_heads=12, num_hidden_layers=12, image_size=224,
                              patch_size=32, layer_norm_eps=1e-5, hidden_act="quick_gelu"),
    "siglip_vision_model": dict(hidden_size=768, num_attention_heads=12, num_hidden_layers=12, image_size=224,
                                patch_size=16, layer_norm_eps=1e-6, hidden_act="gelu_pytorch_tanh"),
}
# DINOv3ViTConfig's (transformers 5.24); the hub's checkpoints state 4 registers.
_DEFAULTS["dinov3_vit"] = dict(
    hidden_size=384, intermediate_size=1536, num_attention_heads=6, num_hidden_layers=12, image_size=224,
    patch_size=16, layer_norm_eps=1e-5, hidden_act="gelu", rope_theta=100.0, query_bias=True, key_bias=False,
    value_bias=True, proj_bias=True, mlp_bias=True, layerscale_value=1.0, use_gated_mlp=False, num_register_tokens=0)
_DEFAULTS.update(deit=_DEFAULTS["vit"], dinov2_with_registers=_DEFAULTS["dinov2"])
# Without preprocessor_config.json: the mean and std of the family's image processor (None: it states none that
# fits the weights, so the file is refused). BitImageProcessor, DINOv2's, defaults to CLIP's mean and std, while
# DINOv2 was trained with ImageNet's: every hub directory states them.
_PROCESSOR_DEFAULTS = {
    "vit": {}, "deit": dict(input_mean=IMAGENET_MEAN, input_std=IMAGENET_STD), "dinov2": None,
    "dinov2_with_registers": None, "clip_vision_model": dict(input_mean=OPENAI_CLIP_MEAN, input_std=OPENAI_CLIP_STD),
    "siglip_vision_model": {}, "dinov3_vit": dict(input_mean=IMAGENET_MEAN, input_std=IMAGENET_STD),
}
_POSITIONS = "Transformer/posembed_input/pos_embedding"


def matches(path):
    """Whether `path` is a directory whose `config.json` states a transformers `model_type`.

    Any `model_type` is taken here (timm's config.json has none), so that a family keras_vit does not read ('swin',
    'beit', ...) is refused by that name rather than as a malformed timm folder.
    """
    config = os.path.join(str(path), "config.json")
    if not os.path.isfile(config):
        return False
    try:
        with open(config, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "model_type" in data


def read(path, image_size=None, num_heads=None):
    """`(ViTConfig, arrays)` of a transformers directory, the arrays under official keys.

    `image_size` and `num_heads` are stated by `config.json`; the arguments are the registry's common signature.
    """
    path = str(path)
    cfg = _config_json(path)
    tensors = _tensors(path)
    if cfg["model_type"] in ("clip", "siglip"):
        cfg, tensors = _vision_tower(cfg, tensors, path)
    if cfg["model_type"] in ("vit", "deit"):
        config = _config(cfg, tensors, path)
        return config, _to_official(tensors, cfg, config, path)
    reader = {"dinov2": _read_dinov2, "dinov2_with_registers": _read_dinov2, "clip_vision_model": _read_clip,
              "siglip_vision_model": _read_clip, "dinov3_vit": _read_dinov3}[cfg["model_type"]]
    return reader(cfg, tensors, path)


def read_arrays(path, config=None):
    """`(ViTConfig, arrays)`: `config.json` states the whole architecture and its numerics."""
    return read(path)


def labels(path):
    """The class names of a transformers directory (`id2label`, in class order), or None without them."""
    id2label = _config_json(str(path)).get("id2label")
    if not id2label:
        return None
    where = f"{os.path.join(str(path), 'config.json')}: id2label"
    names = {}
    for key, name in id2label.items():  # keyed by class index as text; JSON keeps them in no promised order
        if not re.fullmatch(r"0|[1-9]\d*", str(key)):
            raise ValueError(f"{where} must be keyed by class indices 0, 1, ...; received key {key!r}")
        names[int(key)] = str(name)
    missing = sorted(set(range(max(names) + 1)) - set(names))
    if missing:
        raise ValueError(f"{where} must name every class from 0 to {max(names)}; it skips {missing}")
    return [names[i] for i in range(len(names))]


# ------------------------------------------------------------------ reading
def _config_json(path):
    try:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} is not a transformers model directory: its config.json cannot be read ({exc})") \
            from None
    if cfg.get("model_type") not in MODEL_TYPES:
        raise ValueError(f"{path}/config.json: model_type={cfg.get('model_type')!r}; keras_vit reads transformers "
                         f"model_type {MODEL_TYPES}")
    return cfg


def _tensors(path):
    """The directory's tensors: `model.safetensors`, or the shards its index names."""
    single, index = os.path.join(path, "model.safetensors"), os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(single):
        return read_safetensors(single)
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        tensors = {}
        for shard in shards:
            tensors.update(read_safetensors(os.path.join(path, shard)))
        return tensors
    found = sorted(os.listdir(path))
    if any(name.endswith(".bin") for name in found):
        raise ValueError(f"{path} holds pytorch_model.bin, a pickle keras_vit does not open (it can run code when "
                         "read). Re-save it as safetensors: in Python with transformers, "
                         "`AutoModel.from_pretrained(dir).save_pretrained(dir, safe_serialization=True)`")
    raise ValueError(f"{path} is not a transformers model directory: expected model.safetensors beside config.json, "
                     f"found {found}")


def _preprocessing(path, channels, model_type):
    """input_mean / input_std from `preprocessor_config.json`; without it, its image processor's defaults
    (ViTImageProcessor, SiglipImageProcessor: 0.5; DeiTImageProcessor: ImageNet's; CLIPImageProcessor: CLIP's)."""
    file = os.path.join(path, "preprocessor_config.json")
    if not os.path.isfile(file):
        defaults = _PROCESSOR_DEFAULTS[model_type]
        if defaults is None:
            raise ValueError(f"{path} has no preprocessor_config.json: the mean and std a {model_type} model "
                             "expects are not stated (BitImageProcessor's defaults are CLIP's, DINOv2 was trained "
                             "with ImageNet's); add the preprocessor_config.json of the model's hub directory")
        logging.info("%s has no preprocessor_config.json: inputs normalised with transformers' %s defaults", path,
                     model_type)
        return dict(defaults)
    with open(file, encoding="utf-8") as f:
        cfg = json.load(f)
    if cfg.get("do_rescale", True) and not math.isclose(cfg.get("rescale_factor", 1 / 255), 1 / 255):
        raise ValueError(f"{file}: rescale_factor={cfg['rescale_factor']}; keras_vit's inputs are pixels / 255")
    if not cfg.get("do_normalize", True):
        return dict(input_mean=(0.0,) * channels, input_std=(1.0,) * channels)
    fields = {}
    for ours, theirs in (("input_mean", "image_mean"), ("input_std", "image_std")):
        if cfg.get(theirs) is not None:
            value = cfg[theirs]
            fields[ours] = tuple(value) if isinstance(value, (list, tuple)) else (value,) * channels
    return fields


def _architecture(cfg, tensors, source):
    """The model class the directory holds, from `architectures` or, without it, from its keys."""
    readable = FAMILIES[cfg["model_type"]]
    stated = cfg.get("architectures") or []
    known = [name for name in stated if name in readable]
    if stated and not known:
        raise ValueError(f"{source}/config.json: architectures={stated}; keras_vit reads {list(readable)} of "
                         f"model_type {cfg['model_type']!r}")
    if known:
        return known[0]
    model_type = cfg["model_type"]
    if model_type == "clip_vision_model":
        return readable[1] if "visual_projection.weight" in tensors else readable[0]
    if model_type in ("siglip_vision_model", "dinov3_vit"):
        return readable[0]
    if any(name.startswith(_PREFIXES[model_type]) for name in tensors):
        return readable[0] if model_type in ("vit", "deit") else readable[1]
    return readable[1] if model_type in ("vit", "deit") else readable[0]


def _activation(cfg, source):
    act = cfg.get("hidden_act", _DEFAULTS[cfg["model_type"]]["hidden_act"])
    if act not in ACTIVATIONS:
        raise ValueError(f"{source}/config.json: hidden_act={act!r}; keras_vit's MLP computes {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[act]


def _encoder_fields(cfg, source):
    """The ViTConfig fields every family states the same way, with its configuration class's defaults."""
    defaults = _DEFAULTS[cfg["model_type"]]
    get = lambda key: cfg.get(key, defaults[key])  # noqa: E731
    channels = cfg.get("num_channels", 3)
    return dict(patch_size=get("patch_size"), hidden_size=get("hidden_size"), num_heads=get("num_attention_heads"),
                num_layers=get("num_hidden_layers"), image_size=get("image_size"), channels=channels,
                layer_norm_epsilon=get("layer_norm_eps"), **_activation(cfg, source),
                **_preprocessing(source, channels, cfg["model_type"]))


def _vit_config(fields, source):
    try:
        return ViTConfig(**fields)
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None


def _config(cfg, tensors, source):
    architecture = _architecture(cfg, tensors, source)
    if not cfg.get("qkv_bias", True):
        raise ValueError(f"{source}/config.json: qkv_bias=False; keras_vit reads the transformers ViT / DeiT with "
                         "query, key and value biases")
    pooler = tensors.get("pooler.dense.weight")
    if pooler is not None and architecture == "DeiTModel":
        raise ValueError(f"{source}: DeiTModel's pooler (dense + tanh on the class token, beside the distillation "
                         "token) has no keras_vit counterpart; save the model with add_pooling_layer=False")
    if pooler is not None and cfg.get("pooler_act", "tanh") != "tanh":
        raise ValueError(f"{source}/config.json: pooler_act={cfg['pooler_act']!r}; keras_vit's pre_logits is tanh")
    _check_head(architecture, cfg, tensors, source)
    head = {"ViTForImageClassification": "classifier.weight",
            "DeiTForImageClassificationWithTeacher": "cls_classifier.weight"}.get(architecture)
    return _vit_config(dict(
        _encoder_fields(cfg, source), mlp_dim=cfg.get("intermediate_size", 3072), classifier="token",
        distilled=cfg["model_type"] == "deit", representation_size=None if pooler is None else pooler.shape[0],
        classes=tensors[head].shape[0] if head and head in tensors else 0,
        # ViTEmbeddings.interpolate_pos_encoding (DeiT's the same): F.interpolate bicubic, antialias False.
        interpolation="bicubic_no_antialias",
    ), source)


def _check_head(architecture, cfg, tensors, source):
    """A classifier's head must be whole: a missing bias would read as zero, a missing head as a headless model."""
    heads = {"ViTForImageClassification": ("classifier",),
             "DeiTForImageClassificationWithTeacher": ("cls_classifier", "distillation_classifier"),
             "Dinov2ForImageClassification": ("classifier",),
             "Dinov2WithRegistersForImageClassification": ("classifier",)}.get(architecture)
    if not heads or cfg.get("id2label") == {}:  # num_labels=0: transformers' head is an Identity, with no tensors
        return
    missing = [f"{head}.{part}" for head in heads for part in ("weight", "bias") if f"{head}.{part}" not in tensors]
    if missing:
        raise ValueError(f"{source}: a {architecture} (config.json's architectures, or its prefixed tensor names) "
                         f"classifies with {', '.join(heads)}; expected the tensors {missing}, found none of them "
                         "in model.safetensors")


def _vision_tower(cfg, tensors, source):
    """A CLIPModel's / SiglipModel's image tower, as the directory of CLIPVisionModelWithProjection /
    SiglipVisionModel would hold it: `vision_config` and the `vision_model.*` tensors (CLIP's `visual_projection`
    too). The text tower and the logit scale and bias are left unread."""
    vision = cfg.get("vision_config")
    model_type = cfg["model_type"]
    if not isinstance(vision, dict):
        raise ValueError(f"{source}/config.json: model_type={model_type!r} without a vision_config, so the image "
                         "tower's shape is not stated; save the vision tower alone (in Python with transformers, "
                         f"{'CLIPVisionModelWithProjection' if model_type == 'clip' else 'SiglipVisionModel'}"
                         ".from_pretrained(dir).save_pretrained(out)) and read that")
    text = [name for name in tensors if name.startswith("text_model.")
            or name in ("text_projection.weight", "logit_scale", "logit_bias")]
    logging.info("%s: a %s; its image tower is read, its text tower (%d tensors) is not", source,
                 FAMILIES[model_type][0], len(text))
    tower = {**vision, "model_type": f"{model_type}_vision_model",
             "architectures": ["CLIPVisionModelWithProjection" if model_type == "clip" else "SiglipVisionModel"]}
    return tower, {name: value for name, value in tensors.items() if name not in set(text)}


def _read_dinov2(cfg, tensors, source):
    """Dinov2(WithRegisters)Model and their classifiers."""
    registers = cfg["model_type"] == "dinov2_with_registers"
    architecture = _architecture(cfg, tensors, source)
    _check_head(architecture, cfg, tensors, source)
    inner = _without_prefix(tensors, _PREFIXES[cfg["model_type"]], source)
    swiglu = bool(cfg.get("use_swiglu_ffn", False))
    on_disk = "encoder.layer.0.mlp.weights_in.weight" in inner
    if swiglu != on_disk:
        raise ValueError(f"{source}/config.json: use_swiglu_ffn={swiglu}, but model.safetensors holds "
                         f"{'mlp.weights_in (SwiGLU)' if on_disk else 'mlp.fc1 (no SwiGLU)'}")
    out = inner.get(f"encoder.layer.0.mlp.{'weights_out' if swiglu else 'fc2'}.weight")
    if out is None:
        raise ValueError(f"{source}: no encoder.layer.0.mlp tensors in model.safetensors (found e.g. "
                         f"{sorted(tensors)[:4]})")
    count = inner["embeddings.register_tokens"].shape[1] if "embeddings.register_tokens" in inner else 0
    if registers and count != cfg.get("num_register_tokens", 4):
        raise ValueError(f"{source}/config.json: num_register_tokens={cfg.get('num_register_tokens', 4)}, but "
                         f"embeddings.register_tokens holds {count}")
    classifier = "token_and_gap" if architecture.endswith("ForImageClassification") else "token"
    fields = dict(
        _encoder_fields(cfg, source), mlp_dim=out.shape[1], classifier=classifier,
        layer_scale_init=cfg.get("layerscale_value", 1.0), qkv_bias="all" if cfg.get("qkv_bias", True) else "none",
        num_register_tokens=count, classes=tensors["classifier.weight"].shape[0] if "classifier.weight" in tensors
        else 0,
        # The registers get no position, the class token does: the class row is folded into the class token
        # below, and the table keeps the patch rows alone.
        no_embed_class=registers,
        # Dinov2WithRegistersEmbeddings.interpolate_pos_encoding antialiases; Dinov2Embeddings' does not.
        interpolation="bicubic" if registers else "bicubic_no_antialias",
    )
    if swiglu:  # Dinov2SwiGLUFFN: silu(gate_proj(x)) * up_proj(x), SiLU whatever hidden_act says
        fields.update(gated_mlp=True, activation="silu")
    config = _vit_config(fields, source)
    # embeddings.mask_token: masked-image modelling's input token (bool_masked_pos), unused at inference.
    arrays = _convert(inner, _DINOV2_RULES, config, source, ignored=("embeddings.mask_token",))
    if registers:
        table, token = arrays.get(_POSITIONS), arrays.get("cls")
        if table is not None and token is not None:
            arrays["cls"] = (np.asarray(token, np.float32) + np.asarray(table[:, :1], np.float32))
            arrays[_POSITIONS] = np.ascontiguousarray(table[:, 1:])
    return config, _checked_positions(arrays, config, source, "embeddings.position_embeddings")


def _read_clip(cfg, tensors, source):
    """CLIPVisionModel(WithProjection) and SiglipVisionModel (also the towers of CLIPModel and SiglipModel)."""
    clip = cfg["model_type"] == "clip_vision_model"
    architecture = _architecture(cfg, tensors, source)
    inner = _without_prefix(tensors, "vision_model.", source)
    if not clip and not cfg.get("vision_use_head", True):
        raise ValueError(f"{source}/config.json: vision_use_head=False; such a SiglipVisionModel has no pooled "
                         "output (pooler_output None), and keras_vit's models pool: read it with the head")
    projection = inner.get("visual_projection.weight")
    if clip and architecture == "CLIPVisionModelWithProjection" and projection is None:
        raise ValueError(f"{source}: a CLIPVisionModelWithProjection projects with visual_projection; expected "
                         "the tensor 'visual_projection.weight', found none in model.safetensors")
    if projection is not None and architecture == "CLIPVisionModel":
        # CLIPVisionModel has no projection: transformers drops the tensor as an unexpected key, and so do we.
        logging.warning("%s: visual_projection.weight is unused by a CLIPVisionModel (transformers ignores it "
                        "too); not read", source)
        inner.pop("visual_projection.weight")
        projection = None
    fc1 = inner.get("encoder.layers.0.mlp.fc1.weight")
    if fc1 is None:
        raise ValueError(f"{source}: no encoder.layers.0.mlp.fc1.weight in model.safetensors (found e.g. "
                         f"{sorted(tensors)[:4]})")
    fields = dict(_encoder_fields(cfg, source), mlp_dim=fc1.shape[0], classes=0,
                  # CLIPVisionEmbeddings / SiglipVisionEmbeddings.interpolate_pos_encoding: bicubic, antialias False.
                  interpolation="bicubic_no_antialias")
    if clip:  # post_layernorm on the class token alone: transformers' last_hidden_state is before it
        fields.update(classifier="token", norm_pre=True, patch_bias=False, fc_norm=True,
                      projection_dim=None if projection is None else projection.shape[0])
    else:  # post_layernorm on the sequence, then the MAP head
        fields.update(classifier="map")
        inner = _split_in_projection(inner)
    config = _vit_config(fields, source)
    # embeddings.position_ids: the index buffer older versions saved beside the table; no weight.
    arrays = _convert(inner, _CLIP_RULES if clip else _SIGLIP_RULES, config, source,
                      ignored=("embeddings.position_ids",))
    return config, _checked_positions(arrays, config, source, "embeddings.position_embedding.weight")


def _read_dinov3(cfg, tensors, source):
    """DINOv3ViTModel: rotary positions, no position table, so any resolution (`dynamic_image_size=True`)."""
    _architecture(cfg, tensors, source)  # refuses another class (DINOv3ViTBackbone, ...) by name
    get = lambda key: cfg.get(key, _DEFAULTS["dinov3_vit"][key])  # noqa: E731
    # transformers 5 holds the blocks as model.layer.{i} and writes them as layer.{i} (the hub's names).
    inner = _without_prefix(tensors, "model.", source)
    gated = bool(get("use_gated_mlp"))
    on_disk = "layer.0.mlp.gate_proj.weight" in inner
    if gated != on_disk:
        raise ValueError(f"{source}/config.json: use_gated_mlp={gated}, but model.safetensors holds "
                         f"{'mlp.gate_proj (a gated MLP)' if on_disk else 'no mlp.gate_proj (no gated MLP)'}")
    if "layer.0.mlp.down_proj.weight" not in inner:
        raise ValueError(f"{source}: no layer.0.mlp tensors in model.safetensors (found e.g. {sorted(tensors)[:4]})")
    hidden, width = inner["layer.0.mlp.down_proj.weight"].shape
    registers = inner.get("embeddings.register_tokens")
    count = 0 if registers is None else registers.shape[1]
    if count != get("num_register_tokens"):
        raise ValueError(f"{source}/config.json: num_register_tokens={get('num_register_tokens')}, but "
                         f"embeddings.register_tokens holds {count}")
    stated = {flag: bool(get(flag)) for flag, _ in _dinov3_biases(gated)}
    _check_dinov3_biases(inner, stated, gated, get("num_hidden_layers"), source)
    # keras_vit holds q and v biases, or all three, or none: a bias of those the file leaves out is a zero, which
    # computes what transformers' Linear without it does (as proj_bias / mlp_bias False: zero output and MLP biases).
    qkv_bias = "all" if stated["key_bias"] else "qv" if stated["query_bias"] or stated["value_bias"] else "none"
    held = {"all": ("query", "key", "value"), "qv": ("query", "value"), "none": ()}[qkv_bias]
    for i in range(get("num_hidden_layers")):
        zeros = {f"attention.{kind[0]}_proj.bias": hidden for kind in held if not stated[f"{kind}_bias"]}
        if not stated["proj_bias"]:
            zeros["attention.o_proj.bias"] = hidden
        if not stated["mlp_bias"]:
            zeros.update({"mlp.up_proj.bias": width, "mlp.down_proj.bias": hidden})
            if gated:
                zeros["mlp.gate_proj.bias"] = width
        inner.update({f"layer.{i}.{name}": np.zeros(size, np.float32) for name, size in zeros.items()})
        if gated:  # gate_proj, up_proj: keras_vit's gated first dense, [gate | value] by columns
            for kind in ("weight", "bias"):
                gate, up = (inner.pop(f"layer.{i}.mlp.{part}.{kind}") for part in ("gate_proj", "up_proj"))
                inner[f"layer.{i}.mlp.weights_in.{kind}"] = np.concatenate([gate, up])
    theta = cfg.get("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta", 100.0))
    fields = dict(
        _encoder_fields(cfg, source), mlp_dim=get("intermediate_size"), gated_mlp=gated, qkv_bias=qkv_bias,
        layer_scale_init=float(get("layerscale_value")), num_register_tokens=count, classifier="token", classes=0,
        # No position table: the blocks turn queries and keys by each patch centre's place in (-1, 1), taken from
        # the input's grid on every call. pos_embed_shift / jitter / rescale are not read: transformers applies
        # them to the coordinates only in training (`if self.training`), never at inference.
        position_embedding="none", rotary_embedding="rope_dinov3", rope_theta=float(theta), dynamic_image_size=True,
    )
    config = _vit_config(fields, source)
    # embeddings.mask_token: masked-image modelling's input token (bool_masked_pos), unused at inference; an
    # empty register_tokens (num_register_tokens=0) holds nothing.
    ignored = ("embeddings.mask_token",) + (() if count else ("embeddings.register_tokens",))
    return config, _convert(inner, _DINOV3_RULES, config, source, ignored=ignored)


def _dinov3_biases(gated):
    """DINOv3ViTConfig's bias flags and the tensors each gives every block."""
    mlp = ("mlp.gate_proj.bias", "mlp.up_proj.bias", "mlp.down_proj.bias") if gated else \
        ("mlp.up_proj.bias", "mlp.down_proj.bias")
    return (("query_bias", ("attention.q_proj.bias",)), ("key_bias", ("attention.k_proj.bias",)),
            ("value_bias", ("attention.v_proj.bias",)), ("proj_bias", ("attention.o_proj.bias",)), ("mlp_bias", mlp))


def _check_dinov3_biases(inner, stated, gated, layers, source):
    """Each bias config.json states is in every block, and none it leaves out is in any (transformers would build
    no place for it and drop it)."""
    for flag, names in _dinov3_biases(gated):
        wanted = [f"layer.{i}.{name}" for i in range(layers) for name in names]
        found = [name for name in wanted if name in inner]
        if stated[flag] and len(found) != len(wanted):
            missing = sorted(set(wanted) - set(found))
            raise ValueError(f"{source}/config.json: {flag}=True, but model.safetensors lacks {missing[:4]}")
        if not stated[flag] and found:
            raise ValueError(f"{source}/config.json: {flag}=False, but model.safetensors holds {found[:4]}: "
                             "transformers builds no such bias and would drop them")


def _without_prefix(tensors, prefix, source):
    """`tensors` named without `prefix` (the base model's prefix inside a task model); the rest as they are."""
    inner = {}
    for name, value in tensors.items():
        short = name[len(prefix):] if name.startswith(prefix) else name
        if short in inner:
            raise ValueError(f"{source}: model.safetensors holds {short!r} both with and without the prefix {prefix!r}")
        inner[short] = value
    return inner


def _split_in_projection(inner):
    """SigLIP's MAP head: nn.MultiheadAttention's packed in_proj rows [q; k; v] as three projections."""
    inner = dict(inner)
    for kind in ("weight", "bias"):
        packed = inner.pop(f"head.attention.in_proj_{kind}", None)
        if packed is not None:
            for part, value in zip(("query", "key", "value"), np.split(np.asarray(packed), 3), strict=True):
                inner[f"head.attention.{part}.{kind}"] = value
    return inner


def _checked_positions(arrays, config, source, name):
    """`arrays`, once their position table is found to fit config.json's grid and prefix tokens."""
    table = arrays.get(_POSITIONS)
    prefix = 0 if config.no_embed_class else config.num_prefix_tokens
    expected = math.prod(config.grid_size) + prefix
    if table is None or table.shape[1] != expected:
        raise ValueError(f"{source}: config.json says a {config.grid_size[0]}x{config.grid_size[1]} grid and "
                         f"{prefix} prefix rows, hence {expected} positions; the file's {name} has "
                         f"{None if table is None else table.shape[1]}")
    return arrays


def _convert(inner, rules, config, source, ignored=()):
    """`{official key: array}` of tensors named without their model prefix; an unknown one is refused by name."""
    arrays, unknown = {}, []
    for name, value in inner.items():
        if name in ignored:
            continue
        for pattern, template, transform in rules:
            match = re.fullmatch(pattern, name)
            if match:
                arrays[match.expand(template)] = np.ascontiguousarray(transform(np.asarray(value), config))
                break
        else:
            unknown.append(name)
    if unknown:
        raise ValueError(f"{source} holds tensors keras_vit's ViT has no place for: {sorted(unknown)[:6]}")
    return arrays


# ------------------------------------------------------------------ weights
def _linear(w, config):  # Linear (out, in) -> Dense (in, out)
    return w.T


def _projection(w, config):  # (heads * head_dim, D) -> (D, heads, head_dim)
    return w.T.reshape(w.shape[1], config.num_heads, -1)


def _projection_bias(b, config):
    return b.reshape(config.num_heads, -1)


def _output(w, config):  # (D, heads * head_dim) -> (heads, head_dim, D)
    return w.T.reshape(config.num_heads, -1, w.shape[0])


def _conv(w, config):  # (D, C, ph, pw) -> (ph, pw, C, D)
    return w.transpose(2, 3, 1, 0)


def _same(a, config):
    return a


def _token(a, config):  # CLIP's class_embedding (D,) -> (1, 1, D)
    return a.reshape(1, 1, -1)


def _table(a, config):  # an nn.Embedding's (rows, D) -> (1, rows, D)
    return a[None]


def _norm(pattern, key):
    """The two rules of a LayerNorm: weight -> `key`/scale, bias -> `key`/bias."""
    return ((pattern + r"\.weight", key + "/scale", _same), (pattern + r"\.bias", key + "/bias", _same))


def _dense(pattern, key, kernel=_linear, bias=_same):
    """The two rules of a Linear: weight -> `key`/kernel, bias -> `key`/bias."""
    return ((pattern + r"\.weight", key + "/kernel", kernel), (pattern + r"\.bias", key + "/bias", bias))


_BLOCK = r"Transformer/encoderblock_\1/"
_ATTENTION = _BLOCK + "MultiHeadDotProductAttention_1/"
# (transformers name without the model prefix, official key, transform); `\1` is the block index.
RULES = (
    (r"embeddings\.cls_token", "cls", _same),
    (r"embeddings\.distillation_token", "dist", _same),
    (r"embeddings\.position_embeddings", _POSITIONS, _same),
    (r"embeddings\.patch_embeddings\.projection\.weight", "embedding/kernel", _conv),
    (r"embeddings\.patch_embeddings\.projection\.bias", "embedding/bias", _same),
    (r"encoder\.layer\.(\d+)\.layernorm_before\.weight", _BLOCK + "LayerNorm_0/scale", _same),
    (r"encoder\.layer\.(\d+)\.layernorm_before\.bias", _BLOCK + "LayerNorm_0/bias", _same),
    (r"encoder\.layer\.(\d+)\.attention\.attention\.(query|key|value)\.weight", _ATTENTION + r"\2/kernel",
     _projection),
    (r"encoder\.layer\.(\d+)\.attention\.attention\.(query|key|value)\.bias", _ATTENTION + r"\2/bias",
     _projection_bias),
    (r"encoder\.layer\.(\d+)\.attention\.output\.dense\.weight", _ATTENTION + "out/kernel", _output),
    (r"encoder\.layer\.(\d+)\.attention\.output\.dense\.bias", _ATTENTION + "out/bias", _same),
    (r"encoder\.layer\.(\d+)\.layernorm_after\.weight", _BLOCK + "LayerNorm_2/scale", _same),
    (r"encoder\.layer\.(\d+)\.layernorm_after\.bias", _BLOCK + "LayerNorm_2/bias", _same),
    (r"encoder\.layer\.(\d+)\.intermediate\.dense\.weight", _BLOCK + "MlpBlock_3/Dense_0/kernel", _linear),
    (r"encoder\.layer\.(\d+)\.intermediate\.dense\.bias", _BLOCK + "MlpBlock_3/Dense_0/bias", _same),
    (r"encoder\.layer\.(\d+)\.output\.dense\.weight", _BLOCK + "MlpBlock_3/Dense_1/kernel", _linear),
    (r"encoder\.layer\.(\d+)\.output\.dense\.bias", _BLOCK + "MlpBlock_3/Dense_1/bias", _same),
    (r"layernorm\.weight", "Transformer/encoder_norm/scale", _same),
    (r"layernorm\.bias", "Transformer/encoder_norm/bias", _same),
    (r"pooler\.dense\.weight", "pre_logits/kernel", _linear),
    (r"pooler\.dense\.bias", "pre_logits/bias", _same),
)
# The heads, named without the model prefix.
HEAD_RULES = (
    (r"(?:classifier|cls_classifier)\.weight", "head/kernel", _linear),
    (r"(?:classifier|cls_classifier)\.bias", "head/bias", _same),
    (r"distillation_classifier\.weight", "head_dist/kernel", _linear),
    (r"distillation_classifier\.bias", "head_dist/bias", _same),
)
# Dinov2 as 5.x writes it (the legacy names: conversion_mapping.py renames q_proj, gate_proj, ... back on saving).
# A SwiGLU's weights_in is [gate; up] by rows: as columns, keras_vit's gated dense_1 [gate | value].
_DINOV2_RULES = (
    (r"embeddings\.cls_token", "cls", _same),
    (r"embeddings\.register_tokens", "reg", _same),
    (r"embeddings\.position_embeddings", _POSITIONS, _same),
    *_dense(r"embeddings\.patch_embeddings\.projection", "embedding", kernel=_conv),
    *_norm(r"encoder\.layer\.(\d+)\.norm1", _BLOCK + "LayerNorm_0"),
    *_dense(r"encoder\.layer\.(\d+)\.attention\.attention\.(query|key|value)", _ATTENTION + r"\2",
            kernel=_projection, bias=_projection_bias),
    *_dense(r"encoder\.layer\.(\d+)\.attention\.output\.dense", _ATTENTION + "out", kernel=_output),
    (r"encoder\.layer\.(\d+)\.layer_scale([12])\.lambda1", _BLOCK + r"LayerScale_\2/scale", _same),
    *_norm(r"encoder\.layer\.(\d+)\.norm2", _BLOCK + "LayerNorm_2"),
    *_dense(r"encoder\.layer\.(\d+)\.mlp\.(?:fc1|weights_in)", _BLOCK + "MlpBlock_3/Dense_0"),
    *_dense(r"encoder\.layer\.(\d+)\.mlp\.(?:fc2|weights_out)", _BLOCK + "MlpBlock_3/Dense_1"),
    *_norm(r"layernorm", "Transformer/encoder_norm"),
    *_dense(r"classifier", "head"),
)
_CLIP_BLOCK_RULES = (
    *_norm(r"encoder\.layers\.(\d+)\.layer_norm1", _BLOCK + "LayerNorm_0"),
    *(rule for short, long in (("q", "query"), ("k", "key"), ("v", "value"))
      for rule in _dense(rf"encoder\.layers\.(\d+)\.self_attn\.{short}_proj", _ATTENTION + long,
                         kernel=_projection, bias=_projection_bias)),
    *_dense(r"encoder\.layers\.(\d+)\.self_attn\.out_proj", _ATTENTION + "out", kernel=_output),
    *_norm(r"encoder\.layers\.(\d+)\.layer_norm2", _BLOCK + "LayerNorm_2"),
    *_dense(r"encoder\.layers\.(\d+)\.mlp\.fc1", _BLOCK + "MlpBlock_3/Dense_0"),
    *_dense(r"encoder\.layers\.(\d+)\.mlp\.fc2", _BLOCK + "MlpBlock_3/Dense_1"),
)
_CLIP_RULES = (
    (r"embeddings\.class_embedding", "cls", _token),
    (r"embeddings\.patch_embedding\.weight", "embedding/kernel", _conv),  # no bias
    (r"embeddings\.position_embedding\.weight", _POSITIONS, _table),
    *_norm(r"pre_layrnorm", "Transformer/norm_pre"),  # transformers' spelling
    *_CLIP_BLOCK_RULES,
    *_norm(r"post_layernorm", "fc_norm"),
    (r"visual_projection\.weight", "projection/kernel", _linear),
)
_MAP = "MAPHead_0/"
_SIGLIP_RULES = (
    *_dense(r"embeddings\.patch_embedding", "embedding", kernel=_conv),
    (r"embeddings\.position_embedding\.weight", _POSITIONS, _table),
    *_CLIP_BLOCK_RULES,
    *_norm(r"post_layernorm", "Transformer/encoder_norm"),
    (r"head\.probe", _MAP + "probe", _same),
    *_dense(r"head\.attention\.(query|key|value)", _MAP + r"MultiHeadDotProductAttention_0/\1", kernel=_projection,
            bias=_projection_bias),
    *_dense(r"head\.attention\.out_proj", _MAP + "MultiHeadDotProductAttention_0/out", kernel=_output),
    *_norm(r"head\.layernorm", _MAP + "LayerNorm_0"),
    *_dense(r"head\.mlp\.fc1", _MAP + "MlpBlock_0/Dense_0"),
    *_dense(r"head\.mlp\.fc2", _MAP + "MlpBlock_0/Dense_1"),
)


# DINOv3ViTModel, blocks named as on disk (`layer.{i}`, without transformers' in-memory `model.`). A gated MLP's
# gate_proj and up_proj are read packed as `weights_in` ([gate; up] by rows): keras_vit's gated dense_1.
_DINOV3_RULES = (
    (r"embeddings\.cls_token", "cls", _same),
    (r"embeddings\.register_tokens", "reg", _same),
    *_dense(r"embeddings\.patch_embeddings", "embedding", kernel=_conv),
    *_norm(r"layer\.(\d+)\.norm1", _BLOCK + "LayerNorm_0"),
    *(rule for short, long in (("q", "query"), ("k", "key"), ("v", "value"))
      for rule in _dense(rf"layer\.(\d+)\.attention\.{short}_proj", _ATTENTION + long, kernel=_projection,
                         bias=_projection_bias)),
    *_dense(r"layer\.(\d+)\.attention\.o_proj", _ATTENTION + "out", kernel=_output),
    (r"layer\.(\d+)\.layer_scale([12])\.lambda1", _BLOCK + r"LayerScale_\2/scale", _same),
    *_norm(r"layer\.(\d+)\.norm2", _BLOCK + "LayerNorm_2"),
    *_dense(r"layer\.(\d+)\.mlp\.(?:up_proj|weights_in)", _BLOCK + "MlpBlock_3/Dense_0"),
    *_dense(r"layer\.(\d+)\.mlp\.down_proj", _BLOCK + "MlpBlock_3/Dense_1"),
    *_norm(r"norm", "Transformer/encoder_norm"),
)


def _to_official(tensors, cfg, config, source):
    """`{official key: array}`; an unknown tensor is refused by name (a masked-image decoder, ...)."""
    prefix = _PREFIXES[cfg["model_type"]]
    prefixed = any(name.startswith(prefix) for name in tensors)  # a task model; a base model's names have none
    arrays, unknown, unused = {}, [], []
    for name, value in tensors.items():
        inner = name[len(prefix):] if prefixed and name.startswith(prefix) else name
        if inner == "embeddings.mask_token":  # masked-image modelling's input token: no part of inference
            continue
        if prefixed and inner.startswith("pooler."):
            # A task model builds its ViTModel/DeiTModel with add_pooling_layer=False and classifies the final
            # layernormed class token; transformers drops such a pooler as an unexpected key, and so do we.
            unused.append(name)
            continue
        rules = HEAD_RULES if prefixed and inner == name else RULES + HEAD_RULES
        for pattern, template, transform in rules:
            match = re.fullmatch(pattern, inner)
            if match:
                arrays[match.expand(template)] = np.ascontiguousarray(transform(np.asarray(value), config))
                break
        else:
            unknown.append(name)
    if unused:
        logging.warning("%s: %s are unused by the classifier, which reads the final layernormed class token "
                        "(transformers ignores them too); not read", source, sorted(unused))
    if unknown:
        raise ValueError(f"{source} holds tensors keras_vit's ViT has no place for: {sorted(unknown)[:6]}")
    if config.distilled and config.classes and "head_dist/kernel" not in arrays:
        raise ValueError(f"{source}: a DeiT with a class-token head only (DeiTForImageClassification) computes "
                         "otherwise than keras_vit's distilled model, which averages two heads; expected "
                         "distillation_classifier (DeiTForImageClassificationWithTeacher)")
    return _checked_positions(arrays, config, source, "embeddings.position_embeddings")


# ------------------------------------------------------------------ writing
def write(model, directory, labels=None):
    """Writes a keras_vit model as a transformers directory that `from_pretrained` loads with the same outputs.

    The model class follows the model's fields:

    - `rotary_embedding="rope_dinov3"`: `DINOv3ViTModel` (blocks named `layer.{i}` as transformers writes them;
      `qkv_bias` as `query_bias` / `key_bias` / `value_bias`; transformers is resolution-free, whatever the
      model's `dynamic_image_size`); another rotary kind has no transformers class and is refused;
    - `classifier="map"`: `SiglipVisionModel` (no class token, the MAP head);
    - `norm_pre=True`: `CLIPVisionModel`, or `CLIPVisionModelWithProjection` with `projection_dim`;
    - registers: `Dinov2WithRegistersModel` (`no_embed_class=True`: the class token is written with a zero
      position row, the exact inverse of the reader's fold) or its classifier;
    - LayerScale or `classifier="token_and_gap"`: `Dinov2Model` (`classifier="token"`), or
      `Dinov2ForImageClassification` (`"token_and_gap"` with a head); a gated MLP as `use_swiglu_ffn`;
    - else `ViTForImageClassification` for a model with a head, `ViTModel` (its pooler the model's
      `pre_logits`) for one without, `DeiTForImageClassificationWithTeacher` / `DeiTModel` for a distilled one.

    Names, layouts and transforms are the reader's tables turned around, so a directory read and written back
    holds transformers' own tensors (DINOv2's unused `mask_token` written as transformers initialises it, zeros);
    `config.json`, `model.safetensors` and the family's `preprocessor_config.json` with the model's mean and std.

    Args:
        model: a keras_vit model (it carries its `ViTConfig`).
        directory: where to write: a new or empty directory (another model's files are never replaced).
        labels: optional class names, one per class (`id2label`); else "LABEL_i".

    Returns:
        `directory`.

    Raises:
        ValueError: naming the field of a configuration the chosen transformers class cannot represent, a
            non-empty `directory`, or NaN or infinite weights; nothing is written.
    """
    from keras_vit.checkpoints.files import refuse_non_empty_directory
    from keras_vit.checkpoints.official import entries, non_finite_keys, non_finite_message, official_key
    from keras_vit.checkpoints.safetensors import write_safetensors

    config = getattr(model, "vit_config", None)
    if config is None:
        raise ValueError(f"The model {model.name!r} carries no ViTConfig; build it with keras_vit.ViT")
    _check_writable(config, labels)
    refuse_non_empty_directory(directory, "A transformers model directory")
    arrays = {}
    for path_in_model, weight, block in entries(model):
        value = np.asarray(weight.numpy(), np.float32)
        arrays[official_key(path_in_model)[0]] = value if block is None else value[block]
    bad = non_finite_keys(arrays)
    if bad:
        raise ValueError(non_finite_message(bad, f"The model {model.name!r}") + f"; nothing was written to {directory}")
    architecture, model_type, _ = _written_architecture(config)
    names = list(labels) if labels is not None else [f"LABEL_{i}" for i in range(config.classes)]
    if model_type in ("vit", "deit"):
        tensors, cfg, processor = _vit_directory(config, arrays, architecture, model_type, directory)
    else:
        tensors = _family_tensors(config, arrays, architecture, model_type)
        cfg, processor = _family_config(config, architecture, model_type), _family_processor(config, model_type)
    if names:  # a model without a head has no labels (transformers writes none)
        cfg.update(id2label={str(i): name for i, name in enumerate(names)},
                   label2id={name: i for i, name in enumerate(names)})
    os.makedirs(directory, exist_ok=True)
    write_safetensors(os.path.join(directory, "model.safetensors"), tensors, {"format": "pt"})
    for name, data in (("config.json", cfg), ("preprocessor_config.json", processor)):
        with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
    return directory


def _vit_directory(config, arrays, architecture, model_type, directory):
    """(tensors, config.json, preprocessor_config.json) of a ViT / DeiT."""
    if architecture == "ViTModel" and not config.representation_size:
        # from_pretrained builds ViTModel with a pooler and initialises it at random (transformers warns on load);
        # said here too, since nothing in config.json can tell ViTModel to leave it out.
        logging.warning("%s is written as ViTModel without pooler.dense: the model has no pre_logits, so the "
                        "pooler_output transformers computes from it is randomly initialised, not this model's; use "
                        "last_hidden_state[:, 0] after its layernorm (what this model computes)", directory)
    prefix = "" if architecture.endswith("Model") else _PREFIXES[model_type]
    tensors = {_written_name(key, prefix, model_type): np.ascontiguousarray(_written_transform(key)(value))
               for key, value in arrays.items()}
    cfg = dict(
        architectures=[architecture], model_type=model_type, hidden_size=config.hidden_size,
        num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
        intermediate_size=config.mlp_dim, hidden_act="gelu_pytorch_tanh" if config.gelu_approximate else "gelu",
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, initializer_range=0.02,
        layer_norm_eps=config.layer_norm_epsilon, image_size=_one_or_pair(config.image_size),
        patch_size=_one_or_pair(config.patch_size), num_channels=config.channels, qkv_bias=True,
        encoder_stride=config.patch_size[0], pooler_output_size=config.representation_size or config.hidden_size,
        pooler_act="tanh", dtype="float32",
    )
    processor = dict(do_normalize=True, do_rescale=True, do_resize=True, image_mean=list(config.input_mean),
                     image_std=list(config.input_std), image_processor_type="ViTImageProcessor", resample=2,
                     rescale_factor=1 / 255, size=dict(zip(("height", "width"), config.image_size, strict=True)))
    return tensors, cfg, processor


def _one_or_pair(pair):
    return pair[0] if pair[0] == pair[1] else list(pair)


def _check_writable(config, labels):
    """Raises naming each field the transformers class the model is written as has no counterpart for."""
    architecture, model_type, reason = _written_architecture(config)
    if model_type in ("vit", "deit"):
        problems = [f"{name}={getattr(config, name)!r} (transformers: {value!r})" for name, value in (
            ("classifier", "token"), ("class_token", True), ("num_register_tokens", 0),
            ("position_embedding", "learned_1d"), ("no_embed_class", False), ("fc_norm", False),
            ("resnet_num_layers", None), ("activation", "gelu"), ("qkv_bias", "all"), ("patch_bias", True),
            ("norm_layer", "layer_norm"), ("qk_norm", False), ("gated_mlp", False), ("patch_norm", False),
            ("projection_dim", None), ("rotary_embedding", None))
            if getattr(config, name) != value]
        if config.representation_size and config.classes:
            problems.append(f"representation_size={config.representation_size} with a head (transformers has a "
                            "pre_logits layer only as ViTModel's pooler, without a head)")
        if config.distilled and config.representation_size:
            problems.append("distilled=True with representation_size (DeiTModel's pooler is not written)")
        if problems:
            raise ValueError("transformers' ViT cannot represent this model: " + "; ".join(problems))
    else:
        problems = _family_problems(config, architecture, model_type)
        if problems:
            raise ValueError(f"transformers' {architecture} (the class for {reason}) cannot represent this model: "
                             + "; ".join(problems))
    if labels is not None and len(labels) != config.classes:
        raise ValueError(f"`labels` must name each of the {config.classes} classes; received {len(labels)} names")


def _written_architecture(config):
    """(model class, model_type, the field that chose it) a model is written as."""
    if config.rotary_embedding == "rope_dinov3":
        return "DINOv3ViTModel", "dinov3_vit", "rotary_embedding='rope_dinov3'"
    if config.classifier == "map":
        return "SiglipVisionModel", "siglip_vision_model", "classifier='map'"
    if config.norm_pre:
        return (("CLIPVisionModelWithProjection" if config.projection_dim else "CLIPVisionModel"), "clip_vision_model",
                "norm_pre=True")
    if config.num_register_tokens:
        return (f"Dinov2WithRegisters{'ForImageClassification' if config.classes else 'Model'}",
                "dinov2_with_registers", f"num_register_tokens={config.num_register_tokens}")
    if config.layer_scale_init is not None or config.classifier == "token_and_gap":
        reason = ("classifier='token_and_gap'" if config.layer_scale_init is None
                  else f"layer_scale_init={config.layer_scale_init!r}")
        return f"Dinov2{'ForImageClassification' if config.classes else 'Model'}", "dinov2", reason
    if config.distilled:
        return ("DeiTForImageClassificationWithTeacher" if config.classes else "DeiTModel"), "deit", "distilled=True"
    return ("ViTForImageClassification" if config.classes else "ViTModel"), "vit", "a class-token ViT"


# What each later family's classes build, as ViTConfig fields: (field, value, what transformers has).
_COMMON_FIELDS = (
    ("position_embedding", "learned_1d", "a learned table"), ("resnet_num_layers", None, "no ResNet stem"),
    ("norm_layer", "layer_norm", "LayerNorm"), ("qk_norm", False, "no q/k norm"),
    ("patch_norm", False, "no norm in the patch embedding"), ("distilled", False, "no distillation token"),
    ("representation_size", None, "no pre_logits layer"), ("rotary_embedding", None, "no rotary positions"),
)
_FAMILY_FIELDS = {
    "dinov2": (
        ("class_token", True, "a class token"), ("norm_pre", False, "no pre-norm"), ("fc_norm", False,
                                                                                  "layernorm on the sequence"),
        ("patch_bias", True, "a patch bias"), ("projection_dim", None, "no projection"),
        ("no_embed_class", False, "a position row for the class token"), ("num_register_tokens", 0, "none")),
    "dinov2_with_registers": (
        ("class_token", True, "a class token"), ("norm_pre", False, "no pre-norm"), ("fc_norm", False,
                                                                                  "layernorm on the sequence"),
        ("patch_bias", True, "a patch bias"), ("projection_dim", None, "no projection"),
        ("no_embed_class", True, "registers without positions, the class row folded into the class token")),
    "clip_vision_model": (
        ("class_token", True, "a class token"), ("classifier", "token", "the class token"),
        ("patch_bias", False, "no patch bias"), ("fc_norm", True, "post_layernorm on the class token"),
        ("classes", 0, "no head"), ("layer_scale_init", None, "no LayerScale"), ("gated_mlp", False, "fc1, fc2"),
        ("qkv_bias", "all", "q, k, v biases"), ("no_embed_class", False, "a position row for the class token"),
        ("num_register_tokens", 0, "none")),
    "siglip_vision_model": (
        ("class_token", False, "no class token"), ("patch_bias", True, "a patch bias"),
        ("fc_norm", False, "post_layernorm on the sequence"), ("classes", 0, "no head"),
        ("projection_dim", None, "no projection"), ("layer_scale_init", None, "no LayerScale"),
        ("gated_mlp", False, "fc1, fc2"), ("qkv_bias", "all", "q, k, v biases"),
        ("no_embed_class", False, "a position table of the patches"), ("num_register_tokens", 0, "none")),
}


# What DINOv3ViTModel builds, as ViTConfig fields (any activation of ACT2FN, q/k/v biases, gated MLP or not,
# registers, patch and image sizes, rope_theta are its config.json's).
_DINOV3_FIELDS = (
    ("position_embedding", "none", "no position table, rotary positions alone"), ("class_token", True, "a class token"),
    ("classifier", "token", "pooler_output, the final-normed class token"),
    ("fc_norm", False, "the final norm on the sequence"), ("classes", 0, "no head"),
    ("representation_size", None, "no pre_logits layer"), ("projection_dim", None, "no projection"),
    ("distilled", False, "no distillation token"), ("resnet_num_layers", None, "no ResNet stem"),
    ("norm_layer", "layer_norm", "LayerNorm"), ("norm_pre", False, "no pre-norm"),
    ("patch_norm", False, "no norm in the patch embedding"), ("patch_bias", True, "a patch bias"),
    ("qk_norm", False, "no q/k norm"), ("attention_norm", False, "no norm before o_proj"),
    ("mlp_norm", False, "no norm in the MLP"),
)


def _family_problems(config, architecture, model_type):
    fields = _DINOV3_FIELDS if model_type == "dinov3_vit" else _COMMON_FIELDS + _FAMILY_FIELDS[model_type]
    problems = [f"{name}={getattr(config, name)!r} (transformers: {what})"
                for name, value, what in fields if getattr(config, name) != value]
    if model_type == "dinov3_vit":
        if config.layer_scale_init is None:
            problems.append("layer_scale_init=None (transformers: LayerScale, layer_scale{1,2}.lambda1)")
        return problems
    for name in ("image_size", "patch_size"):
        pair = getattr(config, name)
        if pair[0] != pair[1]:
            problems.append(f"{name}={pair} (transformers' {model_type} resizes a square grid: one {name})")
    if model_type.startswith("dinov2"):
        if config.layer_scale_init is None:
            problems.append("layer_scale_init=None (transformers: LayerScale, layer_scale{1,2}.lambda1)")
        if config.qkv_bias not in ("all", "none"):
            problems.append(f"qkv_bias={config.qkv_bias!r} (transformers: qkv_bias True or False)")
        if config.classes and config.classifier != "token_and_gap":
            problems.append(f"classifier={config.classifier!r} with a head (transformers' {architecture} "
                            "classifies concat(class token, patch mean): 'token_and_gap')")
        if not config.classes and config.classifier != "token":
            problems.append(f"classifier={config.classifier!r} without a head (transformers' {architecture} "
                            "outputs the class token: 'token')")
        if config.gated_mlp and config.activation != "silu":
            problems.append(f"gated_mlp=True with activation={config.activation!r} (transformers' SwiGLU: 'silu')")
        if _dinov2_mlp_ratio(config) is None:
            problems.append(f"mlp_dim={config.mlp_dim} (transformers' {model_type} builds " + (
                "(int(hidden_size * mlp_ratio * 2 / 3) + 7) // 8 * 8" if config.gated_mlp
                else "hidden_size * mlp_ratio") + f" units, mlp_ratio an int; hidden_size={config.hidden_size} "
                "gives none of that width)")
    return problems


def _dinov2_mlp_ratio(config):
    """The int mlp_ratio (Dinov2Config types it int) from which transformers builds the model's MLP, or None."""
    if not config.gated_mlp:
        return config.mlp_dim // config.hidden_size if config.mlp_dim % config.hidden_size == 0 else None
    for ratio in range(1, 2 * config.mlp_dim // config.hidden_size + 2):  # Dinov2SwiGLUFFN's hidden width
        hidden = int(config.hidden_size * ratio)
        if (int(hidden * 2 / 3) + 7) // 8 * 8 == config.mlp_dim:
            return ratio
    return None


def _hidden_act(config):
    """transformers' hidden_act of the model's activation: the inverse of ACTIVATIONS."""
    if config.activation == "gelu":
        return "gelu_pytorch_tanh" if config.gelu_approximate else "gelu"
    return config.activation


# The reader's transforms and their inverses (official array -> transformers tensor).
_INVERSE_TRANSFORMS = {
    _linear: lambda a: a.T,
    _projection: lambda a: a.reshape(a.shape[0], -1).T,  # (D, heads, head_dim) -> (heads * head_dim, D)
    _projection_bias: lambda a: a.reshape(-1),
    _output: lambda a: a.reshape(-1, a.shape[-1]).T,  # (heads, head_dim, D) -> (D, heads * head_dim)
    _conv: lambda a: a.transpose(3, 2, 0, 1),
    _same: lambda a: a,
    _token: lambda a: a.reshape(-1),
    _table: lambda a: a[0],
}


def _inverse_rules(rules, choices):
    """The reader's `(pattern, template, transform)` rules turned around: `(official-key regex, transformers name
    template, inverse transform)`; `choices` picks the name of each `(?:a|b)` alternative the reader accepts."""
    inverse = []
    for pattern, template, transform in rules:
        groups = re.findall(r"\((?!\?)([^()]*)\)", pattern)
        parts = re.split(r"\\(\d)", template)
        regex = "".join(re.escape(part) if i % 2 == 0 else f"(?P<g{part}>{groups[int(part) - 1]})"
                        for i, part in enumerate(parts))
        numbers = iter(range(1, len(groups) + 1))
        name = re.sub(r"\((\?:)?([^()]*)\)", lambda m, numbers=numbers: choices[m.group(2)] if m.group(1)
                      else f"\\g<g{next(numbers)}>", pattern).replace(r"\.", ".")
        if re.search(r"[\\()|?*+\[\]]", re.sub(r"\\g<g\d>", "", name)):
            raise AssertionError(f"the reader's rule {pattern!r} has no single name to write")
        inverse.append((regex, name, _INVERSE_TRANSFORMS[transform]))
    return inverse


def _family_tensors(config, arrays, architecture, model_type):
    """transformers' tensors of a DINOv2, DINOv3, CLIP or SigLIP model: the reader's names and transforms turned
    around."""
    arrays = dict(arrays)
    if model_type.startswith("dinov2"):
        mlp = ("weights_in", "weights_out") if config.gated_mlp else ("fc1", "fc2")
        rules, choices = _DINOV2_RULES, {"fc1|weights_in": mlp[0], "fc2|weights_out": mlp[1]}
        prefix = "" if architecture.endswith("Model") else _PREFIXES[model_type]
        unprefixed = ("classifier.weight", "classifier.bias")
    elif model_type == "clip_vision_model":  # 5.24 writes CLIPVisionModel without vision_model., ...WithProjection with
        rules, choices, unprefixed = _CLIP_RULES, {}, ("visual_projection.weight",)
        prefix = "vision_model." if config.projection_dim else ""
    elif model_type == "dinov3_vit":  # blocks as layer.{i}, the names on disk (and the hub's)
        rules, prefix, unprefixed = _DINOV3_RULES, "", ()
        choices = {"up_proj|weights_in": "weights_in" if config.gated_mlp else "up_proj"}
    else:
        rules, choices, prefix, unprefixed = _SIGLIP_RULES, {}, "", ()
    if model_type == "dinov2_with_registers":
        # The reader folds the class row into the class token (cls + pos[0]); written back as that token and a zero
        # row, which transformers adds as cls + 0 (exact) and never resizes, and which reads back to the same model.
        table = arrays[_POSITIONS]
        arrays[_POSITIONS] = np.concatenate([np.zeros_like(table[:, :1]), table], axis=1)
    inverse = _inverse_rules(rules, choices)
    tensors = {}
    for key, value in arrays.items():
        for regex, template, transform in inverse:
            match = re.fullmatch(regex, key)
            if match:
                name = match.expand(template)
                tensors[name if name in unprefixed else prefix + name] = np.ascontiguousarray(transform(value))
                break
        else:
            raise ValueError(f"The weight {key!r} has no place in transformers' {architecture}")
    if model_type == "siglip_vision_model":  # nn.MultiheadAttention's packed in_proj, rows [q; k; v]
        for kind in ("weight", "bias"):
            parts = [tensors.pop(f"head.attention.{part}.{kind}") for part in ("query", "key", "value")]
            tensors[f"head.attention.in_proj_{kind}"] = np.concatenate(parts, axis=0)
    if model_type.startswith("dinov2"):
        # Masked-image modelling's input token: no part of inference, not held by keras_vit; transformers'
        # initial value, so that from_pretrained finds every tensor it builds.
        tensors[prefix + "embeddings.mask_token"] = np.zeros((1, config.hidden_size), np.float32)
    if model_type == "dinov3_vit":
        for name in [name for name in tensors if ".mlp.weights_in." in name]:  # [gate; up] rows
            tensors[name.replace("weights_in", "gate_proj")], tensors[name.replace("weights_in", "up_proj")] = \
                np.split(tensors.pop(name), 2)
        # mask_token, as for DINOv2; registers: transformers builds a (1, 0, D) parameter even for none.
        tensors["embeddings.mask_token"] = np.zeros((1, 1, config.hidden_size), np.float32)
        if not config.num_register_tokens:
            tensors["embeddings.register_tokens"] = np.zeros((1, 0, config.hidden_size), np.float32)
    return tensors


def _family_config(config, architecture, model_type):
    """config.json of a DINOv2, DINOv3, CLIP or SigLIP model (the fields its configuration class reads)."""
    cfg = dict(architectures=[architecture], model_type=model_type, hidden_size=config.hidden_size,
               num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
               hidden_act=_hidden_act(config), layer_norm_eps=config.layer_norm_epsilon,
               image_size=config.image_size[0], patch_size=config.patch_size[0], num_channels=config.channels,
               dtype="float32")
    if model_type == "dinov3_vit":
        # pos_embed_shift / jitter / rescale: transformers' training-only RoPE augmentations, at its defaults.
        cfg.update(intermediate_size=config.mlp_dim, image_size=_one_or_pair(config.image_size),
                   patch_size=_one_or_pair(config.patch_size), rope_theta=float(config.rope_theta or 100.0),
                   query_bias=config.qkv_bias != "none", key_bias=config.qkv_bias == "all",
                   value_bias=config.qkv_bias != "none", proj_bias=True, mlp_bias=True,
                   layerscale_value=float(config.layer_scale_init), use_gated_mlp=config.gated_mlp,
                   num_register_tokens=config.num_register_tokens, pos_embed_shift=None, pos_embed_jitter=None,
                   pos_embed_rescale=2.0, attention_dropout=0.0, drop_path_rate=0.0, initializer_range=0.02,
                   apply_layernorm=True, reshape_hidden_states=True)
    elif model_type.startswith("dinov2"):
        cfg.update(initializer_range=0.02, mlp_ratio=_dinov2_mlp_ratio(config), use_swiglu_ffn=config.gated_mlp,
                   qkv_bias=config.qkv_bias == "all", layerscale_value=float(config.layer_scale_init),
                   hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, drop_path_rate=0.0,
                   apply_layernorm=True, reshape_hidden_states=True)
        if config.gated_mlp:  # Dinov2SwiGLUFFN computes SiLU whatever hidden_act says; transformers' default
            cfg["hidden_act"] = "gelu"
        if model_type == "dinov2":
            cfg["use_mask_token"] = True
        else:
            cfg["num_register_tokens"] = config.num_register_tokens
    else:
        cfg.update(intermediate_size=config.mlp_dim, attention_dropout=0.0)
        if model_type == "clip_vision_model":
            cfg.update(projection_dim=config.projection_dim or 512, initializer_range=0.02, initializer_factor=1.0)
        else:
            cfg["vision_use_head"] = True
    return cfg


def _family_processor(config, model_type):
    """preprocessor_config.json: BitImageProcessor (DINOv2), CLIPImageProcessor, SiglipImageProcessor, bicubic,
    or DINOv3ViTImageProcessor, bilinear, with the model's mean and std."""
    side = config.image_size[0]
    if model_type == "dinov3_vit":  # DINOv3ViTImageProcessor: bilinear resize to (height, width), no crop
        return dict(do_normalize=True, do_rescale=True, do_resize=True, image_mean=list(config.input_mean),
                    image_std=list(config.input_std), image_processor_type="DINOv3ViTImageProcessor", resample=2,
                    rescale_factor=1 / 255, size=dict(zip(("height", "width"), config.image_size, strict=True)))
    processor = dict(do_convert_rgb=True, do_normalize=True, do_rescale=True, do_resize=True,
                     image_mean=list(config.input_mean), image_std=list(config.input_std), resample=3,
                     rescale_factor=1 / 255)
    if model_type == "siglip_vision_model":
        return dict(processor, image_processor_type="SiglipImageProcessor", size=dict(height=side, width=side))
    return dict(processor, image_processor_type="CLIPImageProcessor" if model_type == "clip_vision_model"
                else "BitImageProcessor", size=dict(shortest_edge=side), crop_size=dict(height=side, width=side),
                do_center_crop=True)


# official key -> transformers name (without the model prefix); `\1` is the block index.
_WRITTEN_NAMES = (
    (r"cls", "embeddings.cls_token"),
    (r"dist", "embeddings.distillation_token"),
    (r"Transformer/posembed_input/pos_embedding", "embeddings.position_embeddings"),
    (r"embedding/(kernel|bias)", None),
    (r"Transformer/encoderblock_(\d+)/LayerNorm_0/(scale|bias)", r"encoder.layer.\1.layernorm_before.\2"),
    (r"Transformer/encoderblock_(\d+)/MultiHeadDotProductAttention_1/(query|key|value)/(kernel|bias)",
     r"encoder.layer.\1.attention.attention.\2.\3"),
    (r"Transformer/encoderblock_(\d+)/MultiHeadDotProductAttention_1/out/(kernel|bias)",
     r"encoder.layer.\1.attention.output.dense.\2"),
    (r"Transformer/encoderblock_(\d+)/LayerNorm_2/(scale|bias)", r"encoder.layer.\1.layernorm_after.\2"),
    (r"Transformer/encoderblock_(\d+)/MlpBlock_3/Dense_0/(kernel|bias)", r"encoder.layer.\1.intermediate.dense.\2"),
    (r"Transformer/encoderblock_(\d+)/MlpBlock_3/Dense_1/(kernel|bias)", r"encoder.layer.\1.output.dense.\2"),
    (r"Transformer/encoder_norm/(scale|bias)", r"layernorm.\1"),
    (r"pre_logits/(kernel|bias)", r"pooler.dense.\1"),
)
_HEADS = {"vit": {"head": "classifier"},
          "deit": {"head": "cls_classifier", "head_dist": "distillation_classifier"}}


def _written_name(key, prefix, model_type):
    head, _, kind = key.partition("/")
    if head in _HEADS[model_type] and kind in ("kernel", "bias"):
        return f"{_HEADS[model_type][head]}.{'weight' if kind == 'kernel' else 'bias'}"
    if key.startswith("embedding/"):
        return prefix + f"embeddings.patch_embeddings.projection.{'weight' if key.endswith('kernel') else 'bias'}"
    for pattern, template in _WRITTEN_NAMES:
        match = re.fullmatch(pattern, key)
        if match and template:
            name = match.expand(template)
            return prefix + re.sub(r"\.(kernel|scale)$", ".weight", name)
    raise ValueError(f"The weight {key!r} has no place in transformers' ViT")


def _written_transform(key):
    """How an official array becomes the transformers tensor: the inverse of the reading transforms."""
    if key == "embedding/kernel":
        return lambda a: a.transpose(3, 2, 0, 1)
    if re.search(r"MultiHeadDotProductAttention_1/(query|key|value)/kernel$", key):
        return lambda a: a.reshape(a.shape[0], -1).T  # (D, heads, head_dim) -> (heads * head_dim, D)
    if re.search(r"MultiHeadDotProductAttention_1/(query|key|value)/bias$", key):
        return lambda a: a.reshape(-1)
    if re.search(r"MultiHeadDotProductAttention_1/out/kernel$", key):
        return lambda a: a.reshape(-1, a.shape[-1]).T  # (heads, head_dim, D) -> (D, heads * head_dim)
    if key.endswith("/kernel"):  # Dense (in, out) -> Linear (out, in)
        return lambda a: a.T
    return lambda a: a

