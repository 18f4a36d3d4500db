"""`"learned_2d"`: a learned row table and column table (paper, Appendix D.4).

Each table is D/2 wide; a patch gets the concatenation of its row's and its
column's embedding, and prefix tokens get no position. The official code has
no such tables: their keys are a keras_vit extension in the official style.
Each table resamples along its own axis.
"""

import numpy as np
from keras import ops

from keras_vit.positions.base import PositionKind, needs_resample
from keras_vit.resize import resize_sequence


class Learned2D(PositionKind):
    name = "learned_2d"
    adds_to_tokens = True
    # keras_vit extension keys.
    checkpoint_keys = {
        "row_embedding": "Transformer/posembed_input/row_embedding",
        "column_embedding": "Transformer/posembed_input/column_embedding",
    }

    def weight_shapes(self, width, grid_size, prefix_rows, num_heads=None):
        if width % 2:
            raise ValueError(f"learned_2d position embeddings need an even hidden_size; received {width}")
        return {"row_embedding": (grid_size[0], width // 2), "column_embedding": (grid_size[1], width // 2)}

    def table(self, weights, size, grid_size, prefix_rows, width, interpolation):
        rows, cols = size
        row, column = weights["row_embedding"], weights["column_embedding"]
        if needs_resample(size, grid_size):
            row = resize_sequence(row, rows, interpolation)
            column = resize_sequence(column, cols, interpolation)
        row = ops.broadcast_to(row[:, None], (rows, cols, row.shape[-1]))
        column = ops.broadcast_to(column[None, :], (rows, cols, column.shape[-1]))
        return ops.reshape(ops.concatenate([row, column], axis=-1), (rows * cols, -1))

    def resize(self, tables, grid_size, prefix_rows, interpolation, source_grid=None):
        return {
            name: np.asarray(resize_sequence(tables[name], size, interpolation), np.float32)
            for name, size in (("row_embedding", grid_size[0]), ("column_embedding", grid_size[1]))
        }

    def file_grid(self, tables, prefix_rows, source):
        return len(tables["row_embedding"]), len(tables["column_embedding"])


KIND = Learned2D()
