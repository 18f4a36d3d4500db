"""The named ViT configurations: the only table of model sizes, read as `ViTConfig`s.

Widths, depths and heads are Table 1 of Dosovitskiy et al. (2021) for
Base, Large and Huge, and Table 1 of Touvron et al. (2021, DeiT) for Tiny and
Small (as also used by Steiner et al., 2021, "How to train your ViT?"); Medium
and giant are Table 2 of Zhai et al. (2022, "Scaling Vision Transformers"),
the sizes of timm's `vit_medium_*` and `vit_giant_*` (its checkpoint reader
takes its sizes from this table).
A variant name is `"<size>/<patch>"`, e.g. `"B/16"`; a hybrid puts its
ResNet stem in front, `"R50+B/16"` (Section 3.1 and Appendix B.1 of the paper;
the stems of `vit_jax/configs/models.py`). A hybrid's "/16" is the total
stride: ResNet stem stride times its patch size.
"""

import dataclasses
import re

from keras_vit.config import ViTConfig


@dataclasses.dataclass(frozen=True)
class Size:
    """The encoder dimensions of one model size."""

    # Token width D.
    hidden_size: int
    # Hidden width of each MLP (4 * D, but for giant's 6144).
    mlp_dim: int
    # Attention heads per block.
    num_heads: int
    # Encoder blocks.
    num_layers: int


SIZES = {
    "Ti": Size(hidden_size=192, mlp_dim=768, num_heads=3, num_layers=12),
    "S": Size(hidden_size=384, mlp_dim=1536, num_heads=6, num_layers=12),
    "M": Size(hidden_size=512, mlp_dim=2048, num_heads=8, num_layers=12),
    "B": Size(hidden_size=768, mlp_dim=3072, num_heads=12, num_layers=12),
    "L": Size(hidden_size=1024, mlp_dim=4096, num_heads=16, num_layers=24),
    "H": Size(hidden_size=1280, mlp_dim=5120, num_heads=16, num_layers=32),
    "g": Size(hidden_size=1408, mlp_dim=6144, num_heads=16, num_layers=40),
}


@dataclasses.dataclass(frozen=True)
class Stem:
    """A hybrid's ResNet stem and the patch size applied to its output."""

    # Bottleneck units per ResNet stage; () is the root block alone.
    resnet_num_layers: tuple
    # Channel multiplier of the ResNet (64 * width_factor root channels).
    resnet_width_factor: float
    # Patch size on the feature map.
    patch_size: int


# Key: (stem name, total stride). R50 uses (3, 4, 9) units, not ResNet-50's
# (3, 4, 6, 3), so that its output stride is 16 (the official comment).
STEMS = {
    ("R50", 16): Stem((3, 4, 9), 1.0, 1),
    ("R50", 32): Stem((3, 4, 6, 3), 1.0, 1),
    ("R26", 32): Stem((2, 2, 2, 2), 1.0, 1),
    # The root block alone (stride 4) and 8x8 patches: AugReg's R+Ti/16.
    ("R", 16): Stem((), 1.0, 8),
}


def decode_variant(variant):
    """Returns the `ViTConfig` of a variant such as `"B/16"` or `"R50+B/16"`.

    Args:
        variant: str. `"<size>/<patch>"` with size in Ti, S, M, B, L, H, g, or a
            hybrid `"<stem>+<size>/<total stride>"`.

    Returns:
        A `keras_vit.ViTConfig` (224 px, 1000 classes, the official
        numerics); pass it to `keras_vit.ViT` with any field changed.

    Example:
    >>> decode_variant("S/16").hidden_size
    384
    """
    match = re.fullmatch(r"(?:(R\d*)\+)?(\w+)/(\d+)", str(variant))
    stem = match and match.group(1) and STEMS.get((match.group(1), int(match.group(3))))
    if not match or match.group(2) not in SIZES or (match.group(1) and not stem):
        raise ValueError(
            f"`variant` must look like '<size>/<patch>' with size in {tuple(SIZES)} (e.g. 'B/16'), "
            f"or a hybrid among {[f'{name}+<size>/{stride}' for name, stride in STEMS]}; "
            f"received variant={variant!r}"
        )
    fields = {"patch_size": int(match.group(3)), **dataclasses.asdict(SIZES[match.group(2)])}
    if stem:
        fields.update(dataclasses.asdict(stem))
    return ViTConfig(**fields)


# The named variants, one builder each (`keras_vit.ViT_B16`, ...): the paper's, DeiT's Ti and S, and the
# hybrids with official checkpoints.
VARIANTS = {name: decode_variant(name) for name in (
    "Ti/16", "S/16", "S/32", "B/8", "B/16", "B/32", "L/16", "L/32", "H/14",
    "R+Ti/16", "R26+S/32", "R26+B/32", "R50+B/16", "R50+L/32")}


def variant_fields(variant):
    """The fields that make the encoder of `variant`: patch, sizes and stem (None without one)."""
    names = ("patch_size", *(f.name for f in dataclasses.fields(Size)), *(f.name for f in dataclasses.fields(Stem)))
    encoder = decode_variant(variant)
    return {name: getattr(encoder, name) for name in names}


def variant_name(config):
    """The variant a configuration's encoder is (e.g. "B/16", "R50+B/16"), or None."""
    size = next((name for name, s in SIZES.items() if dataclasses.astuple(s) == (
        config.hidden_size, config.mlp_dim, config.num_heads, config.num_layers)), None)
    if size is None or config.patch_size[0] != config.patch_size[1]:
        return None
    if config.resnet_num_layers is None:
        return f"{size}/{config.patch_size[0]}"
    return next((f"{stem}+{size}/{stride}" for (stem, stride), s in STEMS.items()
                 if (s.resnet_num_layers, s.patch_size) == (config.resnet_num_layers, config.patch_size[0])), None)
