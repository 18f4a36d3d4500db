"""What the embeddings learned: position-embedding similarity and patch-filter components.

The two panels of Dosovitskiy et al. (2021), Figure 7: the principal
components of the patch-embedding filters (left) and the cosine similarity
of each patch's position embedding with every other's (centre).
"""

import numbers

import keras
import numpy as np

from keras_vit.analysis.blocks import check_model

# Kinds with a learned table to compare (keras_vit.positions).
LEARNED_POSITIONS = ("learned_1d", "learned_2d")


def position_embedding_similarity(model):
    """Cosine similarity between the position embeddings of every pair of patches.

    `learned_1d`: the rows of the table for the patches (prefix rows left
    out). `learned_2d`: each patch's concatenated row and column embeddings.

    Args:
        model: a keras_vit ViT with learned absolute positions.

    Returns:
        `(rows, cols, rows, cols)` float64 array at the model's grid:
        `[i, j]` is the map of patch (i, j)'s similarity with every patch.

    Example:
    >>> vit = keras_vit.ViT(patch_size=4, hidden_size=8, mlp_dim=16, num_heads=2, num_layers=1, image_size=(8, 12))
    >>> position_embedding_similarity(vit).shape
    (2, 3, 2, 3)
    """
    check_model(model)
    layer = model.get_layer("position_embedding")
    config = getattr(model, "vit_config", None)
    kind = config.position_embedding if config is not None else layer.kind
    if kind not in LEARNED_POSITIONS:
        raise ValueError(f"position_embedding_similarity compares learned position tables, {LEARNED_POSITIONS}; "
                         f"model {model.name!r} has position_embedding={kind!r}, which has none")
    rows, cols = layer.grid_size
    width = model.get_layer("patch_embedding").hidden_size
    # convert_to_numpy, not np.asarray: a PyTorch tensor computed from trainable weights refuses the latter.
    table = np.asarray(keras.ops.convert_to_numpy(layer.grid_table(rows, cols, width)), np.float64)  # (rows*cols, D)
    unit = table / np.maximum(np.linalg.norm(table, axis=-1, keepdims=True), np.finfo(np.float64).tiny)
    return (unit @ unit.T).reshape(rows, cols, rows, cols)


def embedding_filter_components(model, count=28):
    """The principal components of the patch-embedding filters.

    The kernel `(p, p, channels, width)` is `width` filters of `p * p *
    channels` values; their mean is removed and the components are the
    right singular vectors, largest first.

    Args:
        model: a keras_vit ViT.
        count: int. Components to return, at most `min(width, p * p *
            channels)`. Defaults to 28 (the paper's figure).

    Returns:
        `(components, explained_variance_ratio)`: `(count, p, p, channels)`
        float64 orthonormal components, and `(count,)` the share of the
        filters' variance each explains.

    Example:
    >>> vit = keras_vit.ViT(patch_size=4, hidden_size=8, mlp_dim=16, num_heads=2, num_layers=1, image_size=8)
    >>> components, ratios = embedding_filter_components(vit, count=3)
    >>> components.shape, ratios.shape
    ((3, 4, 4, 3), (3,))
    """
    check_model(model)
    kernel = np.asarray(model.get_layer("patch_embedding").kernel.numpy(), np.float64)
    filters = kernel.reshape(-1, kernel.shape[-1]).T  # (width, p * p * channels)
    most = min(filters.shape)
    if not isinstance(count, numbers.Integral) or isinstance(count, bool) or not 1 <= count <= most:
        raise ValueError(f"`count` must be an int in [1, {most}] (filters {filters.shape[0]} of size "
                         f"{filters.shape[1]}); received count={count!r}")
    _, singular, components = np.linalg.svd(filters - filters.mean(axis=0), full_matrices=False)
    variance = singular**2
    ratios = variance / variance.sum() if variance.sum() > 0 else np.zeros_like(variance)
    return components[:count].reshape(count, *kernel.shape[:-1]), ratios[:count]
