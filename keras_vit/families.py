"""The later ViT families as `keras.applications`-style builders: DINOv2, DeiT III, CLIP towers, EVA02 and DINOv3.

Each size is a `ViTConfig` (`FAMILIES`) with the numerics of the library
whose weights it loads (timm's: exact GELU, bicubic position resizing, the
family's epsilon, mean and std), and its released weights are named by tag
(`WEIGHTS`), each a Hugging Face hub id of timm's, read from the local cache
first (`keras_vit.checkpoints.hub`): `keras_vit.DINOv2_S14(weights="lvd142m")`.
`weights` also takes a path or any hub id. docs/PRETRAINED.md lists the
weights with their sources and licences. EVA02 and DINOv3 (timm's `Eva`
class) have rotary positions; their configurations are what the timm reader
makes of their architectures (`keras_vit.checkpoints.timm.EVA_ARCHITECTURES`).
"""

import dataclasses

from keras_vit.config import IMAGENET_MEAN, IMAGENET_STD, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, ViTConfig


@dataclasses.dataclass(frozen=True)
class FamilyWeights:
    """Released weights of a family size: where they are and what they hold."""

    # The Hugging Face hub id (timm's repository).
    hub_id: str
    # Classes of the file's head (0: none; CLIP's head is its image projection).
    classes: int
    license: str
    # Who trained them.
    source: str
    # The file's resolution where it is not the family's (EVA02's MIM weights: 224): the model is built at it
    # unless `image_size`, `input_shape` or `input_tensor` says otherwise.
    image_size: int | None = None


_TIMM_NUMERICS = dict(gelu_approximate=False, interpolation="bicubic")
_DINOV2 = dict(_TIMM_NUMERICS, layer_scale_init=1e-5, image_size=518, classes=0, input_mean=IMAGENET_MEAN,
               input_std=IMAGENET_STD)
_REGISTERS = dict(num_register_tokens=4, no_embed_class=True)
_DEIT3 = dict(_TIMM_NUMERICS, layer_scale_init=1e-6, no_embed_class=True, input_mean=IMAGENET_MEAN,
              input_std=IMAGENET_STD)
_CLIP = dict(_TIMM_NUMERICS, norm_pre=True, patch_bias=False, layer_norm_epsilon=1e-5, input_mean=OPENAI_CLIP_MEAN,
             input_std=OPENAI_CLIP_STD)


def _size(patch, width, mlp, heads, depth, **fields):
    return ViTConfig(patch_size=patch, hidden_size=width, mlp_dim=mlp, num_heads=heads, num_layers=depth, **fields)


# (timm's size name, patch, width, MLP, heads, depth, extra fields) of each family size.
_DINOV2_SIZES = {"S/14": ("small", 384, 1536, 6, 12, {}), "B/14": ("base", 768, 3072, 12, 12, {}),
                 "L/14": ("large", 1024, 4096, 16, 24, {}),
                 # giant: SwiGLU (timm's SwiGLUPacked, mlp_ratio 5.33334: 8192 packed, 4096 gated)
                 "G/14": ("giant", 1536, 4096, 24, 40, dict(gated_mlp=True, activation="silu"))}
_DEIT3_SIZES = {"S/16": ("small", 16, 384, 1536, 6, 12), "M/16": ("medium", 16, 512, 2048, 8, 12),
                "B/16": ("base", 16, 768, 3072, 12, 12), "L/16": ("large", 16, 1024, 4096, 16, 24),
                "H/14": ("huge", 14, 1280, 5120, 16, 32)}
_CLIP_SIZES = {"B/16": ("base", 16, 768, 3072, 12, 12, 512), "B/32": ("base", 32, 768, 3072, 12, 12, 512),
               "L/14": ("large", 14, 1024, 4096, 16, 24, 768)}
_APACHE, _MIT = "apache-2.0", "mit"
# EVA02 (timm's eva02_*_patch14_*, models/eva.py): SwiGLU of 8/3 the width (base and large: q/k/v projections apart
# and the SwiGLU's sub-LN), query and value biases, rotary positions on the 16 x 16 pretraining grid beside the
# learned table, mean of the patches then fc_norm; OpenAI CLIP's mean and std, as timm's pretrained_cfg.
_EVA02 = dict(_TIMM_NUMERICS, gated_mlp=True, activation="silu", qkv_bias="qv", rotary_embedding="rope_eva",
              rope_reference_grid=(16, 16), classifier="gap", class_token=True, fc_norm=True,
              input_mean=OPENAI_CLIP_MEAN, input_std=OPENAI_CLIP_STD)
# (timm's size name, width, MLP, heads, depth, the classifier's resolution, the MIM pretraining tags, the
# fine-tuned tags (each: classes), extra fields). The classifiers are timm's fine-tuned weights: ImageNet-1k at
# 336 px for tiny and small, and at 448 px (also through ImageNet-22k) for base and large.
_EVA02_FINE = {"ft_in1k": 1000, "ft_in22k": 21841, "ft_in22k_in1k": 1000}
_EVA02_SIZES = {
    "Ti/14": ("tiny", 192, 512, 3, 12, 336, ("mim_in22k",), {"mim_in22k_ft_in1k": 1000}, {}),
    "S/14": ("small", 384, 1024, 6, 12, 336, ("mim_in22k",), {"mim_in22k_ft_in1k": 1000}, {}),
    "B/14": ("base", 768, 2048, 12, 12, 448, ("mim_in22k",),
             {f"mim_in22k_{tail}": classes for tail, classes in _EVA02_FINE.items()}, dict(mlp_norm=True)),
    "L/14": ("large", 1024, 2730, 16, 24, 448, ("mim_in22k", "mim_m38m"),
             {f"mim_{data}_{tail}": classes for data in ("in22k", "m38m") for tail, classes in _EVA02_FINE.items()},
             dict(mlp_norm=True)),
}
_EVA02_DATA = {"in22k": "ImageNet-22k", "m38m": "Merged-38M"}
_EVA02_TUNED = {"ft_in1k": "fine-tuned on ImageNet-1k", "ft_in22k": "fine-tuned on ImageNet-22k",
                "ft_in22k_in1k": "fine-tuned on ImageNet-22k, then 1k"}
# DINOv3 (timm's vit_*_patch16_dinov3, models/eva.py): 4 registers, no learned table, rotary positions on the patch
# centres, LayerScale, eps 1e-5, any resolution (timm's dynamic_img_size), final norm then the mean of the patches
# (timm's default pooling); the "plus" sizes have SwiGLU. No q/k/v bias: the _qkvb builds load by hub id with
# qkv_bias="qv".
_DINOV3 = dict(_TIMM_NUMERICS, layer_scale_init=1e-5, layer_norm_epsilon=1e-5, qkv_bias="none", num_register_tokens=4,
               position_embedding="none", rotary_embedding="rope_dinov3", dynamic_image_size=True, image_size=256,
               classifier="gap", class_token=True, classes=0, input_mean=IMAGENET_MEAN, input_std=IMAGENET_STD)
_DINOV3_SIZES = {"S/16": ("small", 384, 1536, 6, 12, {}), "S+/16": ("small_plus", 384, 1536, 6, 12, dict(
                     gated_mlp=True, activation="silu")), "B/16": ("base", 768, 3072, 12, 12, {}),
                 "L/16": ("large", 1024, 4096, 16, 24, {}),
                 "H+/16": ("huge_plus", 1280, 5120, 20, 32, dict(gated_mlp=True, activation="silu"))}
_DINOV3_LICENSE = "dinov3-license"


def _tables():
    """`(FAMILIES, WEIGHTS)`: each size's ViTConfig, and its released weights by tag."""
    families, weights = {}, {}
    for name, (timm_size, width, mlp, heads, depth, extra) in _DINOV2_SIZES.items():
        for registers in (False, True):
            key = f"DINOv2-{name}" + "-reg" * registers
            families[key] = _size(14, width, mlp, heads, depth, **_DINOV2, **extra,
                                  **(_REGISTERS if registers else {}))
            repo = f"timm/vit_{timm_size}_patch14_{'reg4_' * registers}dinov2.lvd142m"
            weights[key] = {"lvd142m": FamilyWeights(repo, 0, _APACHE, "Meta AI (DINOv2, LVD-142M)")}
    for name, (timm_size, patch, width, mlp, heads, depth) in _DEIT3_SIZES.items():
        families[f"DeiT3-{name}"] = _size(patch, width, mlp, heads, depth, **_DEIT3)
        weights[f"DeiT3-{name}"] = {
            tag: FamilyWeights(f"timm/deit3_{timm_size}_patch{patch}_224.{tag}", 1000, _APACHE,
                               f"Meta AI (DeiT III, {source})")
            for tag, source in (("fb_in1k", "ImageNet-1k"), ("fb_in22k_ft_in1k", "ImageNet-21k, then 1k"))}
    for name, (timm_size, patch, width, mlp, heads, depth, projection) in _CLIP_SIZES.items():
        families[f"CLIP-{name}"] = _size(patch, width, mlp, heads, depth, classes=projection, **_CLIP)
        weights[f"CLIP-{name}"] = {
            tag: FamilyWeights(f"timm/vit_{timm_size}_patch{patch}_clip_224.{tag}", projection, _MIT, source)
            for tag, source in (("openai", "OpenAI (CLIP)"), ("laion2b", "LAION (OpenCLIP, LAION-2B)"))}
    for name, (timm_size, width, mlp, heads, depth, resolution, mim, tuned, extra) in _EVA02_SIZES.items():
        families[f"EVA02-{name}"] = _size(14, width, mlp, heads, depth, image_size=resolution, classes=1000,
                                          **_EVA02, **extra)
        weights[f"EVA02-{name}"] = {
            **{tag: FamilyWeights(f"timm/eva02_{timm_size}_patch14_224.{tag}", 0, _MIT,
                                  f"BAAI (EVA-02, MIM on {_EVA02_DATA[tag[4:]]})", 224) for tag in mim},
            **{tag: FamilyWeights(f"timm/eva02_{timm_size}_patch14_{resolution}.{tag}", classes, _MIT,
                                  f"BAAI (EVA-02, MIM on {_EVA02_DATA[tag.split('_')[1]]}, "
                                  f"{_EVA02_TUNED[tag.split('_', 2)[2]]})") for tag, classes in tuned.items()}}
    for name, (timm_size, width, mlp, heads, depth, extra) in _DINOV3_SIZES.items():
        families[f"DINOv3-{name}"] = _size(16, width, mlp, heads, depth, **_DINOV3, **extra)
        weights[f"DINOv3-{name}"] = {"lvd1689m": FamilyWeights(
            f"timm/vit_{timm_size}_patch16_dinov3.lvd1689m", 0, _DINOV3_LICENSE, "Meta AI (DINOv3, LVD-1689M)")}
    return families, weights


FAMILIES, WEIGHTS = _tables()


def builder_for(family):
    """The builder of a family size: "DINOv2-S/14-reg" -> "DINOv2_S14", "DINOv3-H+/16" -> "DINOv3_H16Plus"."""
    name = family.replace("-reg", "").replace("-", "_").replace("/", "")
    return name.replace("+", "") + "Plus" if "+" in name else name


def markdown_table():
    """The family weights as Markdown, for docs/PRETRAINED.md (a test keeps it current)."""
    lines = ["| builder | `weights=` | Hugging Face hub id | px | classes | source | licence |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for family, tags in WEIGHTS.items():
        builder = builder_for(family)
        call = f"{builder}(registers=True)" if family.endswith("-reg") else builder
        lines += [f"| `{call}` | `{tag!r}` | `{w.hub_id}` | {w.image_size or FAMILIES[family].image_size[0]} | "
                  f"{w.classes or '-'} | {w.source} | {w.license} |" for tag, w in tags.items()]
    return "\n".join(lines) + "\n"


def _builder(family, builder_name, default_top, default_activation, doc):
    """A builder of `family` ("DINOv2-S/14"); with `registers`, its register variant where there is one."""

    def builder(include_top=default_top, weights=None, input_tensor=None, input_shape=None, pooling=None,
                classes=None, classifier_activation=default_activation, registers=False, **kwargs):
        from keras_vit.checkpoints.resolve import weights_kind
        from keras_vit.model import ViT

        name = family + "-reg" * bool(registers)
        if name not in FAMILIES:
            held = FAMILIES[family].num_register_tokens
            raise ValueError(f"{builder_name} has no register variant to choose"
                             + (f" (its {held} register tokens are always there)" if held else "")
                             + f"; received registers={registers!r}")
        config = FAMILIES[name]
        if weights is not None and weights_kind(weights) == "pretrained":  # a tag, not a path or a hub id
            if weights not in WEIGHTS[name]:
                raise ValueError(f"{builder_name}{'(registers=True)' * bool(registers)} has the released weights "
                                 f"{sorted(WEIGHTS[name])}, or takes a path or a hub id; received weights={weights!r}")
            named = WEIGHTS[name][weights]
            weights, classes = named.hub_id, named.classes if classes is None else classes
            if named.image_size and "image_size" not in kwargs and input_shape is None and input_tensor is None:
                kwargs["image_size"] = named.image_size
        kwargs.setdefault("name", builder_name.lower() + "_reg" * bool(registers))
        classes = config.classes if classes is None else classes
        return ViT(config, include_top=include_top, weights=weights, input_tensor=input_tensor,
                   input_shape=input_shape, pooling=pooling, classes=classes,
                   classifier_activation=classifier_activation, **kwargs)

    builder.__name__ = builder.__qualname__ = builder_name
    config = FAMILIES[family]
    tags = ", ".join(f"`{tag!r}` ({w.hub_id})" for tag, w in WEIGHTS[family].items())
    builder.__doc__ = doc.format(builder=builder_name, family=family, size=2 * config.patch_size[0],
                                 classes=config.classes, width=config.hidden_size, px=config.image_size[0], tags=tags)
    return builder


_SIGNATURE = """
    Args: the `keras.applications` ones (`include_top`, `weights`, `input_tensor`, `input_shape`, `pooling`,
    `classes`, `classifier_activation`) and any `keras_vit.ViTConfig` field (`image_size`, `drop_path_rate`,
    ...). `weights`: None, a tag of the released weights, {tags}, or a path or hub id. Named weights set
    `classes` to the file's; position tables are resized to `image_size`.
"""
_DINOV2_DOC = """Builds {family} (Oquab et al., 2023, "DINOv2"), a feature extractor: LayerScale blocks, 518 px.

    Without a head by default (the released weights have none): the model returns the final-normed class
    token. `registers=True` builds the variant with 4 register tokens (Darcet et al., 2024).
""" + _SIGNATURE + """
    Example:
    >>> keras_vit.{builder}(image_size={size}, num_layers=1).output_shape[-1] > 0
    True
"""
_DEIT3_DOC = """Builds {family} (Touvron et al., 2022, "DeiT III"): LayerScale blocks, no class position, 224 px.
""" + _SIGNATURE + """
    Example:
    >>> keras_vit.{builder}(classes=10, image_size={size}, num_layers=1).output_shape
    (None, 10)
"""
_CLIP_DOC = """Builds the {family} image tower (Radford et al., 2021) in timm's layout: pre-norm, no patch bias.

    Its head is CLIP's image projection (no activation by default): the output is the image embedding. The
    released OpenAI weights were trained with QuickGELU; timm's files, read here, state exact GELU (pass
    `activation="quick_gelu"` with weights that state it).
""" + _SIGNATURE + """
    Example:
    >>> keras_vit.{builder}(image_size={size}, num_layers=1).output_shape
    (None, {classes})
"""
_EVA02_DOC = """Builds {family} (Fang et al., 2024, "EVA-02"): SwiGLU blocks, rotary positions (`rope_eva`), {px} px.

    The default is the classifier timm fine-tuned at {px} px ({classes} classes: the ImageNet-1k weights of
    the largest resolution timm has for this size, where its EVA-02 models are best). `weights="mim_in22k"`
    (and L's `"mim_m38m"`) are the masked-image-modelling weights, a feature extractor without a head, at
    224 px, the resolution they were trained at: named weights build the model at their file's resolution
    unless `image_size` or `input_shape` is given. `include_top` defaults to the weights' (a head where they
    have one). Rotary positions rescale any grid onto the 16 x 16 pretraining grid, as timm's.
""" + _SIGNATURE + """
    Example:
    >>> keras_vit.{builder}(image_size={size}, num_layers=1).output_shape
    (None, {classes})
"""
_DINOV3_DOC = """Builds {family} (Siméoni et al., 2025, "DINOv3"), a feature extractor: 4 registers, rotary positions.

    Without a head by default (the released weights have none). As timm's `vit_*_patch16_dinov3`: any
    resolution the patch divides (`dynamic_image_size=True`; {px} px is timm's), rotary positions on the patch
    centres (`rope_dinov3`) and no learned table, and the features are the final-normed mean of the patch
    tokens (timm's default pooling); `classifier="token"` gives the class token, DINOv3's own representation.
    The licence of the weights is Meta's DINOv3 License, not an open-source one.
""" + _SIGNATURE + """
    Example:
    >>> keras_vit.{builder}(num_layers=1).output_shape
    (None, {width})
"""

DINOv2_S14 = _builder("DINOv2-S/14", "DINOv2_S14", False, "softmax", _DINOV2_DOC)
DINOv2_B14 = _builder("DINOv2-B/14", "DINOv2_B14", False, "softmax", _DINOV2_DOC)
DINOv2_L14 = _builder("DINOv2-L/14", "DINOv2_L14", False, "softmax", _DINOV2_DOC)
DINOv2_G14 = _builder("DINOv2-G/14", "DINOv2_G14", False, "softmax", _DINOV2_DOC)
DeiT3_S16 = _builder("DeiT3-S/16", "DeiT3_S16", True, "softmax", _DEIT3_DOC)
DeiT3_M16 = _builder("DeiT3-M/16", "DeiT3_M16", True, "softmax", _DEIT3_DOC)
DeiT3_B16 = _builder("DeiT3-B/16", "DeiT3_B16", True, "softmax", _DEIT3_DOC)
DeiT3_L16 = _builder("DeiT3-L/16", "DeiT3_L16", True, "softmax", _DEIT3_DOC)
DeiT3_H14 = _builder("DeiT3-H/14", "DeiT3_H14", True, "softmax", _DEIT3_DOC)
CLIP_B16 = _builder("CLIP-B/16", "CLIP_B16", True, None, _CLIP_DOC)
CLIP_B32 = _builder("CLIP-B/32", "CLIP_B32", True, None, _CLIP_DOC)
CLIP_L14 = _builder("CLIP-L/14", "CLIP_L14", True, None, _CLIP_DOC)
EVA02_Ti14 = _builder("EVA02-Ti/14", "EVA02_Ti14", None, "softmax", _EVA02_DOC)
EVA02_S14 = _builder("EVA02-S/14", "EVA02_S14", None, "softmax", _EVA02_DOC)
EVA02_B14 = _builder("EVA02-B/14", "EVA02_B14", None, "softmax", _EVA02_DOC)
EVA02_L14 = _builder("EVA02-L/14", "EVA02_L14", None, "softmax", _EVA02_DOC)
DINOv3_S16 = _builder("DINOv3-S/16", "DINOv3_S16", False, "softmax", _DINOV3_DOC)
DINOv3_S16Plus = _builder("DINOv3-S+/16", "DINOv3_S16Plus", False, "softmax", _DINOV3_DOC)
DINOv3_B16 = _builder("DINOv3-B/16", "DINOv3_B16", False, "softmax", _DINOV3_DOC)
DINOv3_L16 = _builder("DINOv3-L/16", "DINOv3_L16", False, "softmax", _DINOV3_DOC)
DINOv3_H16Plus = _builder("DINOv3-H+/16", "DINOv3_H16Plus", False, "softmax", _DINOV3_DOC)
