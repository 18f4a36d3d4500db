"""Absolute position embeddings, and the assembly of the token sequence.

Appendix D.4 of Dosovitskiy et al. (2021) compares the kinds offered here:
- `"learned_1d"`: one learned row per sequence position, prefix tokens
  included (the paper's default; `Transformer/posembed_input/pos_embedding`
  in the official checkpoints, initialised with a normal of stddev 0.02).
- `"learned_2d"`: a row table and a column table of width D/2 each; a patch
  gets the concatenation of its row's and its column's embedding.
- `"sincos_2d"`: fixed sines and cosines of the column and row index
  (big_vision's `posemb_sincos_2d`, temperature 10000).
- `"none"`: no absolute position (used with relative attention).

The layer takes the patch grid and the prefix tokens and returns the flat
sequence, because the two conventions differ only in where prefix tokens get
a position: `learned_1d` adds its first rows to them (the official code
concatenates the class token, then adds), the 2-D kinds leave them alone.

Every kind stores its grid as (rows, cols) and resamples it to another grid:
in the graph when the model sees another resolution (`dynamic_image_size`),
or once with `resized_weights` when a checkpoint is loaded at a new size.
"""

import keras
import numpy as np
from keras import ops

from keras_vit.layers.utils import check_choice, to_pair
from keras_vit.resize import INTERPOLATIONS, resize_grid, resize_sequence

KINDS = ("learned_1d", "learned_2d", "sincos_2d", "none")


def sincos_2d(rows, cols, width, temperature=10000.0, dtype="float32"):
    """Fixed 2-D sine-cosine embeddings, `(rows * cols, width)`.

    The first half of the width encodes the column, the second the row, each
    as sines then cosines of `width / 4` geometric frequencies (big_vision).
    """
    quarter = width // 4
    omega = ops.arange(quarter, dtype=dtype) / max(quarter - 1, 1)
    omega = 1.0 / ops.power(ops.cast(temperature, dtype), omega)
    y, x = ops.meshgrid(ops.arange(rows, dtype=dtype), ops.arange(cols, dtype=dtype), indexing="ij")
    x = ops.reshape(x, (-1, 1)) * omega[None]
    y = ops.reshape(y, (-1, 1)) * omega[None]
    return ops.concatenate([ops.sin(x), ops.cos(x), ops.sin(y), ops.cos(y)], axis=1)


@keras.saving.register_keras_serializable(package="keras_vit")
class PositionEmbedding(keras.layers.Layer):
    """Adds position embeddings and returns the flat token sequence.

    Args:
        kind: str. One of `"learned_1d"`, `"learned_2d"`, `"sincos_2d"`,
            `"none"`. Defaults to `"learned_1d"`.
        grid_size: int or (rows, cols). The patch grid the tables are made
            for. Defaults to `(14, 14)` (224 px with 16 px patches).
        num_prefix_tokens: int. Tokens put before the patches (1 for a class
            token, 2 with a distillation token). Defaults to 1.
        interpolation: str. How tables are resampled to another grid:
            `"bilinear"` (corner-aligned, the official way) or `"bicubic"`
            (timm's). Defaults to `"bilinear"`.
        initializer: initializer of learned tables. Defaults to a normal with
            stddev 0.02 (the official initialisation).
        prefix_positions: bool. Whether `learned_1d` has rows for the prefix
            tokens (official) or leaves them without a position (timm's
            `no_embed_class`). Defaults to True.

    Call arguments:
        patches: `(batch, rows, cols, hidden_size)` patch embeddings. Another
            grid than `grid_size` is resampled in the graph.
        prefix_tokens: `(batch, num_prefix_tokens, hidden_size)`, or None
            when `num_prefix_tokens=0`.

    Returns:
        `(batch, num_prefix_tokens + rows * cols, hidden_size)`.

    Example:
    >>> layer = PositionEmbedding("learned_2d", grid_size=(4, 6), num_prefix_tokens=0)
    >>> tuple(layer(np.zeros((2, 4, 6, 16))).shape)
    (2, 24, 16)
    """

    def __init__(
        self,
        kind="learned_1d",
        grid_size=(14, 14),
        num_prefix_tokens=1,
        interpolation="bilinear",
        initializer=None,
        prefix_positions=True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.kind = check_choice(kind, KINDS, "kind")
        self.grid_size = to_pair(grid_size, "grid_size")
        if int(num_prefix_tokens) < 0:
            raise ValueError(
                f"`num_prefix_tokens` must be >= 0; received num_prefix_tokens={num_prefix_tokens}"
            )
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.interpolation = check_choice(interpolation, INTERPOLATIONS, "interpolation")
        self.initializer = keras.initializers.get(
            initializer or keras.initializers.RandomNormal(stddev=0.02)
        )
        self.prefix_positions = bool(prefix_positions)
        # Rows of a learned_1d table that belong to prefix tokens.
        self.prefix_rows = self.num_prefix_tokens if self.prefix_positions else 0

    def build(self, patches_shape, prefix_tokens_shape=None):
        if len(patches_shape) != 4:
            raise ValueError(
                "PositionEmbedding expects a patch grid (batch, rows, cols, hidden_size); "
                f"received shape {tuple(patches_shape)}"
            )
        width = patches_shape[-1]
        rows, cols = self.grid_size
        if self.kind == "learned_1d":
            self.embedding = self.add_weight(
                name="embedding",
                shape=(1, self.prefix_rows + rows * cols, width),
                initializer=self.initializer,
            )
        elif self.kind == "learned_2d":
            if width % 2:
                raise ValueError(
                    f"learned_2d position embeddings need an even hidden_size; received {width}"
                )
            self.row_embedding = self.add_weight(
                name="row_embedding", shape=(rows, width // 2), initializer=self.initializer
            )
            self.column_embedding = self.add_weight(
                name="column_embedding", shape=(cols, width // 2), initializer=self.initializer
            )
        elif self.kind == "sincos_2d" and width % 4:
            raise ValueError(
                f"sincos_2d position embeddings need hidden_size divisible by 4; received {width}"
            )

    def grid_table(self, rows, cols, width, tables=None):
        """The `(rows * cols, width)` embeddings of a grid, or None for "none".

        Args:
            rows, cols: ints or scalar tensors, the grid to embed.
            width: int. The embedding width.
            tables: optional replacement for the layer's weights (the same
                names), e.g. float64 arrays when resizing a checkpoint.
        """
        tables = tables or {w.name: w for w in self.weights}
        # Tensors stand for sizes unknown until run time: always resample
        # them (the matrices are the identity when the sizes agree).
        static = isinstance(rows, int) and isinstance(cols, int)
        resample = not static or (rows, cols) != self.grid_size
        if self.kind == "learned_1d":
            grid = ops.reshape(
                tables["embedding"][0, self.prefix_rows :], (*self.grid_size, -1)
            )
            if resample:
                grid = resize_grid(grid, (rows, cols), self.interpolation)
            return ops.reshape(grid, (-1, grid.shape[-1]))
        if self.kind == "learned_2d":
            row, column = tables["row_embedding"], tables["column_embedding"]
            if resample:
                row = resize_sequence(row, rows, self.interpolation)
                column = resize_sequence(column, cols, self.interpolation)
            row = ops.broadcast_to(row[:, None], (rows, cols, row.shape[-1]))
            column = ops.broadcast_to(column[None, :], (rows, cols, column.shape[-1]))
            return ops.reshape(ops.concatenate([row, column], axis=-1), (rows * cols, -1))
        if self.kind == "sincos_2d":
            return sincos_2d(rows, cols, width)
        return None

    def resized_weights(self, grid_size):
        """Weights of this layer resampled for `grid_size`, as numpy arrays.

        The prefix rows of `learned_1d` are kept; grids are resampled with
        `self.interpolation` in float64 (the official code uses
        `scipy.ndimage.zoom(order=1)`). Returns a dict keyed by weight name.
        """
        rows, cols = to_pair(grid_size, "grid_size")
        tables = {w.name: np.asarray(w.numpy(), np.float64) for w in self.weights}
        if self.kind == "learned_1d":
            width = tables["embedding"].shape[-1]
            grid = self.grid_table(rows, cols, width, tables)
            prefix = tables["embedding"][0, : self.prefix_rows]
            table = np.concatenate([prefix, np.asarray(grid)])[None]
            return {"embedding": table.astype(np.float32)}
        if self.kind == "learned_2d":
            return {
                name: np.asarray(resize_sequence(tables[name], size, self.interpolation), np.float32)
                for name, size in (("row_embedding", rows), ("column_embedding", cols))
            }
        return {}

    def call(self, patches, prefix_tokens=None):
        if (prefix_tokens is None and self.num_prefix_tokens) or (
            prefix_tokens is not None and prefix_tokens.shape[1] != self.num_prefix_tokens
        ):
            received = None if prefix_tokens is None else tuple(prefix_tokens.shape)
            raise ValueError(
                f"PositionEmbedding was configured for num_prefix_tokens={self.num_prefix_tokens}; "
                f"received prefix_tokens of shape {received}"
            )
        shape = ops.shape(patches)
        rows, cols, width = patches.shape[1], patches.shape[2], patches.shape[3]
        rows = shape[1] if rows is None else rows
        cols = shape[2] if cols is None else cols
        # rows * cols, not -1: with an unknown batch, -1 would leave the token count unknown in a graph.
        tokens = ops.reshape(patches, (shape[0], rows * cols, width))
        table = self.grid_table(rows, cols, width)
        if table is not None:
            tokens = tokens + ops.cast(table, self.compute_dtype)[None]
        if not self.num_prefix_tokens:
            return tokens
        if self.kind == "learned_1d" and self.prefix_rows:
            prefix_rows = self.embedding[:, : self.prefix_rows]
            prefix_tokens = prefix_tokens + ops.cast(prefix_rows, self.compute_dtype)
        return ops.concatenate([ops.cast(prefix_tokens, tokens.dtype), tokens], axis=1)

    def compute_output_shape(self, patches_shape, prefix_tokens_shape=None):
        _, rows, cols, width = patches_shape
        length = None if rows is None or cols is None else rows * cols
        if length is not None:
            length += self.num_prefix_tokens
        return (patches_shape[0], length, width)

    def get_config(self):
        return {
            **super().get_config(),
            "kind": self.kind,
            "grid_size": self.grid_size,
            "num_prefix_tokens": self.num_prefix_tokens,
            "interpolation": self.interpolation,
            "initializer": keras.initializers.serialize(self.initializer),
            "prefix_positions": self.prefix_positions,
        }
