"""`"learned_1d"`: one learned row per sequence position (the paper's default).

The official table is `Transformer/posembed_input/pos_embedding`, `(1,
prefix + rows * cols, D)`, initialised with a normal of stddev 0.02. Its
first rows belong to the prefix tokens (the official code concatenates the
class token, then adds); timm's `no_embed_class` leaves them out
(`prefix_rows=0`). The patch rows are a grid, resampled as one 2-D image of
D channels (the official `scipy.ndimage.zoom(order=1)`).
"""

import numpy as np
from keras import ops

from keras_vit.positions.base import PositionKind, needs_resample, square_grid
from keras_vit.resize import resize_grid


class Learned1D(PositionKind):
    name = "learned_1d"
    adds_to_tokens = True
    checkpoint_keys = {"embedding": "Transformer/posembed_input/pos_embedding"}

    def weight_shapes(self, width, grid_size, prefix_rows, num_heads=None):
        return {"embedding": (1, prefix_rows + grid_size[0] * grid_size[1], width)}

    def table(self, weights, size, grid_size, prefix_rows, width, interpolation):
        grid = ops.reshape(weights["embedding"][0, prefix_rows:], (*grid_size, -1))
        if needs_resample(size, grid_size):
            grid = resize_grid(grid, size, interpolation)
        return ops.reshape(grid, (-1, grid.shape[-1]))

    def prefix_table(self, weights, prefix_rows):
        return weights["embedding"][:, :prefix_rows] if prefix_rows else None

    def resize(self, tables, grid_size, prefix_rows, interpolation, source_grid=None):
        source_grid = source_grid or self.file_grid(tables, prefix_rows, None)
        embedding = tables["embedding"]
        grid = self.table(tables, tuple(grid_size), source_grid, prefix_rows, embedding.shape[-1], interpolation)
        table = np.concatenate([embedding[0, :prefix_rows], np.asarray(grid)])[None]
        return {"embedding": table.astype(np.float32)}

    def file_grid(self, tables, prefix_rows, source):
        what = "pos_embedding" if source is None else f"{source}: pos_embedding"
        return square_grid(tables["embedding"].shape[1] - prefix_rows, what)


KIND = Learned1D()
