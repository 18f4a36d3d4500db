"""Position embeddings as a registry: one module per kind, looked up by name.

Each module defines one kind object (`KIND`, a `PositionKind`) that owns its
role (added to the tokens, or a bias of the attention logits), its weights,
its computation, its resize to another grid and its checkpoint keys
(`keras_vit/positions/base.py` lists them). The layers, the model builder and
the checkpoint code ask `get(name)`; no other module branches on a kind's
name. The table below is written out, so a reader sees every kind in one
place and no import fills it by side effect.
"""

import re

from keras_vit.positions import learned_1d, learned_2d, none, relative, relative_2d, sincos_2d
from keras_vit.positions.base import PositionKind

# Name -> kind, in the order `ViTConfig.position_embedding` lists them.
KINDS = {
    kind.name: kind
    for kind in (learned_1d.KIND, learned_2d.KIND, sincos_2d.KIND, relative.KIND, relative_2d.KIND, none.KIND)
}


def get(name):
    """The kind named `name` (`"learned_1d"`, ...); a ValueError naming the kinds otherwise.

    Example:
    >>> kind = get("relative")
    >>> kind.biases_attention, kind.weight_shapes(64, (2, 2), 1, num_heads=4)
    (True, {'relative_embedding': (9, 4, 16)})
    """
    if name not in KINDS:
        raise ValueError(f"`position_embedding` must be one of {tuple(KINDS)}; received position_embedding={name!r}")
    return KINDS[name]


def checkpoint_rules():
    """Every kind's `(weight path pattern, key template)` rows, each once (kinds may share a table)."""
    return tuple(dict.fromkeys(rule for kind in KINDS.values() for rule in kind.checkpoint_rules()))


def is_table(weight_path):
    """Whether a model's weight path (`encoder_block_0/attention/relative_embedding`) is a kind's table."""
    return any(re.fullmatch(pattern, weight_path) for pattern, _ in checkpoint_rules())


__all__ = ["KINDS", "PositionKind", "checkpoint_rules", "get", "is_table"]
