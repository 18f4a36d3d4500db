"""Hugging Face `transformers` ViT and DeiT model directories, in and out, without torch.

A directory written by `save_pretrained` (`config.json` with `model_type`
"vit" or "deit", `model.safetensors` or its shards, and usually the image
processor's `preprocessor_config.json`) holds one of

- `ViTForImageClassification` (`vit.*` + `classifier`): class-token pooling, head;
- `ViTModel` (no prefix, + `pooler.dense`): the pooler, dense + tanh on the
  class token, is keras_vit's `pre_logits` (`representation_size`), no head;
- `DeiTForImageClassificationWithTeacher` (`deit.*`, `cls_classifier`,
  `distillation_classifier`): keras_vit's `distilled=True`, the two heads'
  logits averaged as transformers does at inference; `DeiTModel` without its
  pooler.

Numerics come from the files: `hidden_act` ("gelu" is exact, "gelu_new" /
"gelu_pytorch_tanh" the tanh approximation), `layer_norm_eps` (1e-12 by
default), `image_mean` / `image_std`. What keras_vit cannot represent is
refused by name (`qkv_bias=False`, another activation, a pooler on a DeiT,
`DeiTForImageClassification`'s class-token-only head beside a distillation
token, masked-image-modelling decoders). `pytorch_model.bin` is refused: a
pickle can run code when read. The labels (`id2label`) are read by `labels`.
`write` writes a keras_vit model back as such a directory.
"""

import json
import logging
import math
import os
import re

import numpy as np

from keras_vit.checkpoints.safetensors import read_safetensors
from keras_vit.config import IMAGENET_MEAN, IMAGENET_STD, ViTConfig

DESCRIPTION = "a Hugging Face transformers ViT / DeiT directory (save_pretrained)"
MODEL_TYPES = ("vit", "deit")
ARCHITECTURES = ("ViTForImageClassification", "ViTModel", "DeiTForImageClassificationWithTeacher", "DeiTModel")
# transformers' hidden_act -> keras_vit's gelu_approximate.
ACTIVATIONS = {"gelu": False, "gelu_new": True, "gelu_pytorch_tanh": True}
_PREFIXES = {"vit": "vit.", "deit": "deit."}


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
    config = _config(cfg, tensors, path)
    return config, _to_official(tensors, cfg, config, path)


def read_arrays(path, config=None):
    """`(ViTConfig, arrays)`: `config.json` states the whole architecture and its numerics."""
    return read(path)


def labels(path):
    """The class names of a transformers directory (`id2label`, in class order), or None without them."""
    id2label = _config_json(str(path)).get("id2label")
    if not id2label:
        return None
    return [id2label[str(i)] for i in range(len(id2label))]


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
    (ViTImageProcessor: 0.5; DeiTImageProcessor: ImageNet's)."""
    file = os.path.join(path, "preprocessor_config.json")
    if not os.path.isfile(file):
        logging.info("%s has no preprocessor_config.json: inputs normalised with transformers' %s defaults", path,
                     model_type)
        return dict(input_mean=IMAGENET_MEAN, input_std=IMAGENET_STD) if model_type == "deit" else {}
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
    stated = cfg.get("architectures") or []
    known = [name for name in stated if name in ARCHITECTURES]
    if stated and not known:
        raise ValueError(f"{source}/config.json: architectures={stated}; keras_vit reads {list(ARCHITECTURES)}")
    if known:
        return known[0]
    deit = cfg["model_type"] == "deit"
    if any(name.startswith(("vit.", "deit.")) for name in tensors):
        return "DeiTForImageClassificationWithTeacher" if deit else "ViTForImageClassification"
    return "DeiTModel" if deit else "ViTModel"


def _config(cfg, tensors, source):
    architecture = _architecture(cfg, tensors, source)
    if not cfg.get("qkv_bias", True):
        raise ValueError(f"{source}/config.json: qkv_bias=False; keras_vit's attention always has query, key and "
                         "value biases")
    act = cfg.get("hidden_act", "gelu")
    if act not in ACTIVATIONS:
        raise ValueError(f"{source}/config.json: hidden_act={act!r}; keras_vit's MLP computes {sorted(ACTIVATIONS)}")
    pooler = tensors.get("pooler.dense.weight")
    if pooler is not None and architecture == "DeiTModel":
        raise ValueError(f"{source}: DeiTModel's pooler (dense + tanh on the class token, beside the distillation "
                         "token) has no keras_vit counterpart; save the model with add_pooling_layer=False")
    if pooler is not None and cfg.get("pooler_act", "tanh") != "tanh":
        raise ValueError(f"{source}/config.json: pooler_act={cfg['pooler_act']!r}; keras_vit's pre_logits is tanh")
    _check_head(architecture, cfg, tensors, source)
    head = {"ViTForImageClassification": "classifier.weight",
            "DeiTForImageClassificationWithTeacher": "cls_classifier.weight"}.get(architecture)
    size, patch = cfg.get("image_size", 224), cfg.get("patch_size", 16)
    try:
        return ViTConfig(
            patch_size=patch, hidden_size=cfg.get("hidden_size", 768), mlp_dim=cfg.get("intermediate_size", 3072),
            num_heads=cfg.get("num_attention_heads", 12), num_layers=cfg.get("num_hidden_layers", 12),
            image_size=size, channels=cfg.get("num_channels", 3), classifier="token",
            distilled=cfg["model_type"] == "deit",
            representation_size=None if pooler is None else pooler.shape[0],
            classes=tensors[head].shape[0] if head and head in tensors else 0,
            layer_norm_epsilon=cfg.get("layer_norm_eps", 1e-12), gelu_approximate=ACTIVATIONS[act],
            interpolation="bicubic", **_preprocessing(source, cfg.get("num_channels", 3), cfg["model_type"]),
        )
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None


def _check_head(architecture, cfg, tensors, source):
    """A classifier's head must be whole: a missing bias would read as zero, a missing head as a headless model."""
    heads = {"ViTForImageClassification": ("classifier",),
             "DeiTForImageClassificationWithTeacher": ("cls_classifier", "distillation_classifier")}.get(architecture)
    if not heads or cfg.get("id2label") == {}:  # num_labels=0: transformers' head is an Identity, with no tensors
        return
    missing = [f"{head}.{part}" for head in heads for part in ("weight", "bias") if f"{head}.{part}" not in tensors]
    if missing:
        raise ValueError(f"{source}: a {architecture} (config.json's architectures, or its prefixed tensor names) "
                         f"classifies with {', '.join(heads)}; expected the tensors {missing}, found none of them "
                         "in model.safetensors")


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


_BLOCK = r"Transformer/encoderblock_\1/"
_ATTENTION = _BLOCK + "MultiHeadDotProductAttention_1/"
# (transformers name without the model prefix, official key, transform); `\1` is the block index.
RULES = (
    (r"embeddings\.cls_token", "cls", _same),
    (r"embeddings\.distillation_token", "dist", _same),
    (r"embeddings\.position_embeddings", "Transformer/posembed_input/pos_embedding", _same),
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
    rows = arrays.get("Transformer/posembed_input/pos_embedding")
    expected = math.prod(config.grid_size) + config.num_prefix_tokens
    if rows is None or rows.shape[1] != expected:
        raise ValueError(f"{source}: config.json says a {config.grid_size[0]}x{config.grid_size[1]} grid and "
                         f"{config.num_prefix_tokens} prefix tokens, hence {expected} positions; the file's "
                         f"position_embeddings have {None if rows is None else rows.shape[1]}")
    return arrays


# ------------------------------------------------------------------ writing
def write(model, directory, labels=None):
    """Writes a keras_vit model as a transformers directory that `from_pretrained` loads with the same outputs.

    `ViTForImageClassification` for a model with a head, `ViTModel` (its pooler
    the model's `pre_logits`) for one without, `DeiTForImageClassificationWithTeacher`
    / `DeiTModel` for a distilled one; `config.json`, `model.safetensors` and a
    `preprocessor_config.json` with the model's mean and std.

    Args:
        model: a keras_vit model (it carries its `ViTConfig`).
        directory: where to write: a new or empty directory (another model's files are never replaced).
        labels: optional class names, one per class (`id2label`); else "LABEL_i".

    Returns:
        `directory`.

    Raises:
        ValueError: naming the field of a configuration transformers' ViT cannot represent, a non-empty
            `directory`, or NaN or infinite weights; nothing is written.
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
    architecture, model_type = _written_architecture(config)
    if architecture == "ViTModel" and not config.representation_size:
        # from_pretrained builds ViTModel with a pooler and initialises it at random (transformers warns on load);
        # said here too, since nothing in config.json can tell ViTModel to leave it out.
        logging.warning("%s is written as ViTModel without pooler.dense: the model has no pre_logits, so the "
                        "pooler_output transformers computes from it is randomly initialised, not this model's; use "
                        "last_hidden_state[:, 0] after its layernorm (what this model computes)", directory)
    prefix = "" if architecture.endswith("Model") else _PREFIXES[model_type]
    tensors = {_written_name(key, prefix, model_type): np.ascontiguousarray(_written_transform(key)(value))
               for key, value in arrays.items()}
    os.makedirs(directory, exist_ok=True)
    write_safetensors(os.path.join(directory, "model.safetensors"), tensors, {"format": "pt"})
    names = list(labels) if labels is not None else [f"LABEL_{i}" for i in range(config.classes)]
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
    if names:  # a model without a head has no labels (transformers writes none)
        cfg.update(id2label={str(i): name for i, name in enumerate(names)},
                   label2id={name: i for i, name in enumerate(names)})
    processor = dict(do_normalize=True, do_rescale=True, do_resize=True, image_mean=list(config.input_mean),
                     image_std=list(config.input_std), image_processor_type="ViTImageProcessor", resample=2,
                     rescale_factor=1 / 255, size=dict(zip(("height", "width"), config.image_size, strict=True)))
    for name, data in (("config.json", cfg), ("preprocessor_config.json", processor)):
        with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
    return directory


def _one_or_pair(pair):
    return pair[0] if pair[0] == pair[1] else list(pair)


def _check_writable(config, labels):
    """Raises naming each field transformers' ViT / DeiT has no counterpart for."""
    problems = [f"{name}={getattr(config, name)!r} (transformers: {value!r})" for name, value in (
        ("classifier", "token"), ("class_token", True), ("num_register_tokens", 0),
        ("position_embedding", "learned_1d"), ("no_embed_class", False), ("fc_norm", False),
        ("resnet_num_layers", None), ("activation", "gelu"), ("qkv_bias", "all"), ("patch_bias", True),
        ("norm_layer", "layer_norm"), ("qk_norm", False), ("gated_mlp", False), ("patch_norm", False),
        ("projection_dim", None))
        if getattr(config, name) != value]
    if config.representation_size and config.classes:
        problems.append(f"representation_size={config.representation_size} with a head (transformers has a "
                        "pre_logits layer only as ViTModel's pooler, without a head)")
    if config.distilled and config.representation_size:
        problems.append("distilled=True with representation_size (DeiTModel's pooler is not written)")
    if problems:
        raise ValueError("transformers' ViT cannot represent this model: " + "; ".join(problems))
    if labels is not None and len(labels) != config.classes:
        raise ValueError(f"`labels` must name each of the {config.classes} classes; received {len(labels)} names")


def _written_architecture(config):
    if config.distilled:
        return ("DeiTForImageClassificationWithTeacher" if config.classes else "DeiTModel"), "deit"
    return ("ViTForImageClassification" if config.classes else "ViTModel"), "vit"


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

