"""`"relative_2d"`: a learned embedding per (row, column) offset, added to attention logits.

Patches at (r1, c1) and (r2, c2) use the offset (r1 - r2, c1 - c2) of a
`(2R - 1, 2C - 1, heads, head_dim)` table; three more embeddings serve
prefix-to-patch, patch-to-prefix and prefix-to-prefix pairs (BEiT's
convention: the paper does not say how a class token takes 2-D offsets).
Logits are gathered per offset as for `"relative"`. The index needs the grid,
so the model must be built for its resolution (no `dynamic_image_size`);
the table resamples as a 2-D grid when a checkpoint is loaded at another
size. Keys: a keras_vit extension.
"""

import math

import numpy as np
from keras import ops

from keras_vit.positions.base import PositionKind
from keras_vit.positions.relative import offset_logits
from keras_vit.resize import resize_grid

_ATTENTION = "Transformer/encoderblock_{block}/MultiHeadDotProductAttention_1/"


def relative_2d_index(grid_size, num_prefix_tokens):
    """`(L, L)` int32 index of each (query, key) pair into the offset table.

    Patches at (r1, c1), (r2, c2) use offset (r1 - r2, c1 - c2), stored
    row-major in a (2R-1, 2C-1) table; the three entries after it serve pairs
    that involve a prefix token.
    """
    rows, cols = grid_size
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    r, c = r.reshape(-1), c.reshape(-1)
    dr = r[:, None] - r[None, :] + rows - 1
    dc = c[:, None] - c[None, :] + cols - 1
    patch_index = dr * (2 * cols - 1) + dc
    size = (2 * rows - 1) * (2 * cols - 1)
    p = num_prefix_tokens
    index = np.empty((p + rows * cols,) * 2, np.int32)
    index[p:, p:] = patch_index
    index[:p, p:] = size  # prefix -> patch
    index[p:, :p] = size + 1  # patch -> prefix
    index[:p, :p] = size + 2  # prefix -> prefix
    return index


class Relative2D(PositionKind):
    name = "relative_2d"
    biases_attention = True
    checkpoint_keys = {
        "relative_embedding": _ATTENTION + "relative_embedding",
        "prefix_relative_embedding": _ATTENTION + "prefix_relative_embedding",
    }

    def weight_shapes(self, width, grid_size, prefix_rows, num_heads=None):
        rows, cols = grid_size
        head = (num_heads, width // num_heads)
        return {"relative_embedding": (2 * rows - 1, 2 * cols - 1, *head), "prefix_relative_embedding": (3, *head)}

    def logits(self, weights, query, grid_size, prefix_rows, interpolation):
        static_length = query.shape[1]
        length = ops.shape(query)[1] if static_length is None else static_length
        expected = prefix_rows + math.prod(grid_size)
        if length != expected:
            raise ValueError(
                f"relative_2d attention was built for the grid {grid_size} with {prefix_rows} prefix tokens "
                f"({expected} tokens); received {length} tokens. Build the model for the new resolution "
                "and load the weights into it (the tables are resized on load)."
            )
        patches = weights["relative_embedding"]
        table = ops.concatenate(
            [ops.reshape(patches, (-1, *patches.shape[2:])), weights["prefix_relative_embedding"]], axis=0
        )
        return offset_logits(query, table, relative_2d_index(grid_size, prefix_rows))

    def resize(self, tables, grid_size, prefix_rows, interpolation, source_grid=None):
        rows, cols = grid_size
        resized = resize_grid(tables["relative_embedding"], (2 * rows - 1, 2 * cols - 1), interpolation)
        return {
            "relative_embedding": np.asarray(resized, np.float32),
            "prefix_relative_embedding": np.asarray(tables["prefix_relative_embedding"], np.float32),
        }

    def in_file(self, tables):
        return "relative_embedding" in tables and tables["relative_embedding"].ndim == 4

    def file_grid(self, tables, prefix_rows, source):
        return tuple((n + 1) // 2 for n in tables["relative_embedding"].shape[:2])


KIND = Relative2D()
