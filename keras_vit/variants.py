"""The named ViT configurations: the only table of model sizes.

Widths, depths and heads are Table 1 of Dosovitskiy et al. (2021) for
Base, Large and Huge, and Table 1 of Touvron et al. (2021, DeiT) for Tiny and
Small (as also used by Steiner et al., 2021, "How to train your ViT?").
A variant name is `"<size>/<patch>"`, e.g. `"B/16"`.
"""

import dataclasses
import re


@dataclasses.dataclass(frozen=True)
class Size:
    """The encoder dimensions of one model size."""

    # Token width D.
    hidden_size: int
    # Hidden width of each MLP (4 * D everywhere).
    mlp_dim: int
    # Attention heads per block.
    num_heads: int
    # Encoder blocks.
    num_layers: int


SIZES = {
    "Ti": Size(hidden_size=192, mlp_dim=768, num_heads=3, num_layers=12),
    "S": Size(hidden_size=384, mlp_dim=1536, num_heads=6, num_layers=12),
    "B": Size(hidden_size=768, mlp_dim=3072, num_heads=12, num_layers=12),
    "L": Size(hidden_size=1024, mlp_dim=4096, num_heads=16, num_layers=24),
    "H": Size(hidden_size=1280, mlp_dim=5120, num_heads=16, num_layers=32),
}


def decode_variant(variant):
    """Returns the architecture fields of a variant such as `"B/16"`.

    Args:
        variant: str. `"<size>/<patch>"` with size in Ti, S, B, L, H.

    Returns:
        dict with `patch_size`, `hidden_size`, `mlp_dim`, `num_heads` and
        `num_layers`, ready to pass to `keras_vit.ViT`.

    Example:
    >>> decode_variant("S/16")["hidden_size"]
    384
    """
    match = re.fullmatch(r"(\w+)/(\d+)", str(variant))
    if not match or match.group(1) not in SIZES:
        raise ValueError(
            f"`variant` must look like '<size>/<patch>' with size in {tuple(SIZES)}, "
            f"e.g. 'B/16'; received variant={variant!r}"
        )
    size, patch = match.groups()
    return {"patch_size": int(patch), **dataclasses.asdict(SIZES[size])}
