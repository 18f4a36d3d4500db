"""Layer-wise learning-rate decay: which depth of a ViT each weight belongs to, and its rate's scale there.

The fine-tuning recipes of BEiT, MAE, DINOv2 and timm (`param_groups_layer_decay`) train the weights near the
input more slowly than those near the head: block `i` of `L` takes `decay ** (L - i)` of the learning rate, the
embeddings (patches, positions, class, distillation and register tokens, `norm_pre`, a ResNet stem, a masked-patch
token) `decay ** (L + 1)`, and the final norm, pooling and head the full rate. A scanned encoder's stacked weights
take one scale per block along their first axis.
"""

import numpy as np

from keras_vit.layers.scanned_encoder import block_name

# Layers before the first block, by the names keras_vit's builders give them.
EMBEDDING_LAYERS = ("resnet_stem", "patch_embedding", "patch_norm", "class_token", "distillation_token",
                    "register_tokens", "position_embedding", "norm_pre", "patch_corruption")
SCANNED_ENCODER = "encoder"


def layer_decay_scales(model, decay):
    """`{variable.path: scale}` for each trainable variable of `model` (a keras_vit ViT, or a model holding one).

    A scale is a float, or for a scanned encoder's stacked weight a list of one float per block.

    Raises:
        ValueError: `decay` outside (0, 1], or `model` holds no encoder blocks to count depth by.
    """
    if not 0.0 < decay <= 1.0:
        raise ValueError(f"`layer_decay` must be in (0, 1] (1 leaves every rate as it is); received {decay!r}")
    variables = model.trainable_variables
    num_layers = _num_layers(variables)
    if not num_layers:
        raise ValueError(f"Layer decay scales a ViT's rates by block; model {model.name!r} has no trainable "
                         f"{block_name(0)!r}... or scanned {SCANNED_ENCODER!r} weights")
    scales = {}
    for variable in variables:
        depth = _depth(variable.path, num_layers)
        if isinstance(depth, int):
            scales[variable.path] = float(decay ** (num_layers + 1 - depth))
        else:  # stacked blocks 1..L
            scales[variable.path] = [float(decay ** (num_layers + 1 - d)) for d in depth]
    return scales


def _num_layers(variables):
    """The encoder's depth: the scanned encoder's stack, or the count of blocks named `encoder_block_i`."""
    for variable in variables:
        if SCANNED_ENCODER in variable.path.split("/"):
            return int(variable.shape[0])
    indices = {_block_index(variable.path) for variable in variables} - {None}
    return max(indices) + 1 if indices else 0


def _block_index(path):
    for part in path.split("/"):
        prefix = block_name("")
        if part.startswith(prefix) and part[len(prefix):].isdigit():
            return int(part[len(prefix):])
    return None


def _depth(path, num_layers):
    """0 for the embeddings, i + 1 for block i, L + 1 for what follows the blocks; a range for stacked blocks."""
    parts = path.split("/")
    if SCANNED_ENCODER in parts:
        return range(1, num_layers + 1)
    index = _block_index(path)
    if index is not None:
        return index + 1
    if any(part in EMBEDDING_LAYERS for part in parts):
        return 0
    return num_layers + 1


def stacked_shape(scale, rank):
    """`scale`'s per-block list as an array that broadcasts over a stacked weight of `rank` dimensions."""
    return np.asarray(scale, "float32").reshape((-1,) + (1,) * (rank - 1))
