"""`"relative"`: a learned embedding per 1-D offset, added to attention logits.

Appendix D.4 of Dosovitskiy et al. (2021): every query-key offset `p_q -
p_k` along the flattened sequence (prefix tokens included) has an embedding
per head, `(2L - 1, heads, head_dim)` for L tokens; an extra attention takes
the original queries against these embeddings as keys, and its logits are
added to the content logits. They are computed once per offset,
`(batch, heads, L, 2L - 1)`, then gathered to `(batch, heads, L, L)`, so the
cost is one more attention matmul. The table resamples along its offsets, in
the graph for another sequence length. Keys: a keras_vit extension.
"""

import numpy as np
from keras import ops

from keras_vit.positions.base import PositionKind, square_grid
from keras_vit.resize import resize_sequence


def offset_logits(query, table, index):
    """`query . table[index[q, k]]` per head, `(batch, heads, L, L)`, from one matmul over the offsets."""
    table = ops.cast(table, query.dtype)
    per_offset = ops.einsum("bqhd,ohd->bhqo", query, table)
    return ops.take_along_axis(per_offset, ops.convert_to_tensor(index)[None, None], axis=-1)


class Relative(PositionKind):
    name = "relative"
    biases_attention = True
    checkpoint_keys = {
        "relative_embedding": "Transformer/encoderblock_{block}/MultiHeadDotProductAttention_1/relative_embedding",
    }

    def weight_shapes(self, width, grid_size, prefix_rows, num_heads=None):
        length = prefix_rows + grid_size[0] * grid_size[1]
        return {"relative_embedding": (2 * length - 1, num_heads, width // num_heads)}

    def logits(self, weights, query, grid_size, prefix_rows, interpolation):
        static_length = query.shape[1]
        length = ops.shape(query)[1] if static_length is None else static_length
        table = weights["relative_embedding"]
        if static_length != (table.shape[0] + 1) // 2:
            table = resize_sequence(table, 2 * length - 1, interpolation)
        positions = ops.arange(length, dtype="int32")
        return offset_logits(query, table, positions[:, None] - positions[None, :] + length - 1)

    def resize(self, tables, grid_size, prefix_rows, interpolation, source_grid=None):
        # Only the sequence length matters: the offsets are 1-D.
        length = prefix_rows + grid_size[0] * grid_size[1]
        resized = resize_sequence(tables["relative_embedding"], 2 * length - 1, interpolation)
        return {"relative_embedding": np.asarray(resized, np.float32)}

    def in_file(self, tables):
        return "relative_embedding" in tables and tables["relative_embedding"].ndim == 3

    def file_grid(self, tables, prefix_rows, source):
        length = (len(tables["relative_embedding"]) + 1) // 2 - prefix_rows
        return square_grid(length, f"{source}: relative_embedding")


KIND = Relative()
