"""Mean attention distance: how far in the image each head looks (the paper's Figure 7, right).

Dosovitskiy et al. (2021, Section 4.5, Appendix D.7) compute for each head
the distance in pixels between a query patch and the patches it attends to,
weighted by the attention, as the "receptive field size" of a head. Only
patches take part: prefix tokens (class, distillation) are dropped from the
queries and from the keys, and each query's weights over the patch keys are
renormalised to sum to 1.
"""

import numbers

import numpy as np

from keras_vit.analysis.attention import check_maps
from keras_vit.checks import to_pair


def patch_distances(grid_size, patch_size):
    """`(patches, patches)` pixel distances between patch centres, patches row by row.

    Example:
    >>> patch_distances((1, 2), 16)
    array([[ 0., 16.],
           [16.,  0.]])
    """
    rows, cols = to_pair(grid_size, "grid_size")
    height, width = to_pair(patch_size, "patch_size")
    centres = np.stack(np.meshgrid(np.arange(rows) * height, np.arange(cols) * width, indexing="ij"), -1)
    centres = centres.reshape(-1, 2).astype(np.float64)
    return np.linalg.norm(centres[:, None] - centres[None], axis=-1)


def mean_attention_distance(maps, grid_size, patch_size, num_prefix_tokens):
    """The attention-weighted mean pixel distance of each head of each block.

    Args:
        maps: a list of `(batch, heads, tokens, tokens)` arrays, one per
            block (`attention_maps`), or one `(blocks, batch, heads, tokens,
            tokens)` array.
        grid_size: (rows, cols) of the patch grid the maps come from.
        patch_size: int or (height, width): pixels per token (times the
            ResNet stem's stride for a hybrid: `config.token_size`).
        num_prefix_tokens: int. Tokens before the patches.

    Returns:
        `(blocks, heads)` float64 array: per head, the mean over the images
        and query patches of `sum_k w_qk * distance(q, k)`.

    Example:
    >>> uniform = [np.full((1, 1, 3, 3), 1 / 3)]
    >>> mean_attention_distance(uniform, (1, 2), 16, num_prefix_tokens=1)
    array([[8.]])
    """
    maps = check_maps(maps)
    if isinstance(num_prefix_tokens, bool) or not isinstance(num_prefix_tokens, numbers.Integral):
        raise ValueError(f"`num_prefix_tokens` must be an integer >= 0; "
                         f"received num_prefix_tokens={num_prefix_tokens!r}")
    prefix = int(num_prefix_tokens)
    distances = patch_distances(grid_size, patch_size)
    tokens = maps[0].shape[-1]
    if prefix < 0 or tokens != prefix + len(distances):
        raise ValueError(f"`maps` of {tokens} tokens must hold num_prefix_tokens + rows * cols tokens; received "
                         f"num_prefix_tokens={num_prefix_tokens}, grid_size={grid_size} "
                         f"({prefix} + {len(distances)})")
    per_block = []
    for weights in maps:
        patches = weights[:, :, prefix:, prefix:]
        patches = patches / np.maximum(patches.sum(axis=-1, keepdims=True), np.finfo(np.float64).tiny)
        per_query = (patches * distances).sum(axis=-1)  # (batch, heads, queries)
        per_block.append(per_query.mean(axis=(0, 2)))
    return np.stack(per_block)
