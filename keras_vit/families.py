"""The later ViT families as `keras.applications`-style builders: DINOv2, DeiT III and CLIP towers.

Each size is a `ViTConfig` (`FAMILIES`) with the numerics of the library
whose weights it loads (timm's: exact GELU, bicubic position resizing, the
family's epsilon, mean and std), and its released weights are named by tag
(`WEIGHTS`), each a Hugging Face hub id of timm's, read from the local cache
first (`keras_vit.checkpoints.hub`): `keras_vit.DINOv2_S14(weights="lvd142m")`.
`weights` also takes a path or any hub id. docs/PRETRAINED.md lists the
weights with their sources and licences.
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
    return families, weights


FAMILIES, WEIGHTS = _tables()


def markdown_table():
    """The family weights as Markdown, for docs/PRETRAINED.md (a test keeps it current)."""
    lines = ["| builder | `weights=` | Hugging Face hub id | classes | source | licence |",
             "| --- | --- | --- | --- | --- | --- |"]
    for family, tags in WEIGHTS.items():
        builder = family.replace("-reg", "").replace("-", "_").replace("/", "")
        call = f"{builder}(registers=True)" if family.endswith("-reg") else builder
        lines += [f"| `{call}` | `{tag!r}` | `{w.hub_id}` | {w.classes or '-'} | {w.source} | {w.license} |"
                  for tag, w in tags.items()]
    return "\n".join(lines) + "\n"


def _builder(family, builder_name, default_top, default_activation, doc):
    """A builder of `family` ("DINOv2-S/14"); with `registers`, its register variant where there is one."""

    def builder(include_top=default_top, weights=None, input_tensor=None, input_shape=None, pooling=None,
                classes=None, classifier_activation=default_activation, registers=False, **kwargs):
        from keras_vit.checkpoints.resolve import weights_kind
        from keras_vit.model import ViT

        name = family + "-reg" * bool(registers)
        if name not in FAMILIES:
            raise ValueError(f"{builder_name} has no register variant; received registers={registers!r}")
        config = FAMILIES[name]
        if weights is not None and weights_kind(weights) == "pretrained":  # a tag, not a path or a hub id
            if weights not in WEIGHTS[name]:
                raise ValueError(f"{builder_name}{'(registers=True)' * bool(registers)} has the released weights "
                                 f"{sorted(WEIGHTS[name])}, or takes a path or a hub id; received weights={weights!r}")
            named = WEIGHTS[name][weights]
            weights, classes = named.hub_id, named.classes if classes is None else classes
        kwargs.setdefault("name", builder_name.lower() + "_reg" * bool(registers))
        classes = config.classes if classes is None else classes
        return ViT(config, include_top=include_top, weights=weights, input_tensor=input_tensor,
                   input_shape=input_shape, pooling=pooling, classes=classes,
                   classifier_activation=classifier_activation, **kwargs)

    builder.__name__ = builder.__qualname__ = builder_name
    config = FAMILIES[family]
    builder.__doc__ = doc.format(builder=builder_name, family=family, size=2 * config.patch_size[0],
                                 classes=config.classes, tags=", ".join(
                                     f"`{tag!r}` ({w.hub_id})" for tag, w in WEIGHTS[family].items()))
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
