"""Absolute position embeddings, and the assembly of the token sequence.

The layer takes the patch grid and the prefix tokens and returns the flat
sequence, because the conventions differ only in where prefix tokens get a
position: `learned_1d` adds its first rows to them (the official code
concatenates the class token, then adds), the 2-D kinds leave them alone.

Each kind (`"learned_1d"`, `"learned_2d"`, `"sincos_2d"`, `"none"`; Appendix
D.4 of Dosovitskiy et al., 2021) is a module of `keras_vit.positions`, which
gives its weights, its table for a grid and its resize; this layer holds the
weights. Tables are made for `grid_size` and resampled to another grid: in
the graph when the model sees another resolution (`dynamic_image_size`), or
once with `resized_weights` when a checkpoint is loaded at a new size.
"""

import keras
import numpy as np
from keras import ops

from keras_vit import positions
from keras_vit.checks import check_choice, check_count, to_pair
from keras_vit.layers.initializers import fresh_copy
from keras_vit.positions.sincos_2d import sincos_2d  # noqa: F401 (its home before the registry)
from keras_vit.resize import INTERPOLATIONS

# The kinds that do not live in the attention.
KINDS = tuple(name for name, kind in positions.KINDS.items() if not kind.biases_attention)


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
        # The kind's weights, table and resize (keras_vit.positions).
        self.position = positions.get(kind)
        self.grid_size = to_pair(grid_size, "grid_size")
        self.num_prefix_tokens = check_count(num_prefix_tokens, "num_prefix_tokens")
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
        shapes = self.position.weight_shapes(patches_shape[-1], self.grid_size, self.prefix_rows)
        for index, (name, shape) in enumerate(shapes.items()):  # e.g. self.embedding: the official (1, 1 + N, D)
            # The first table draws from `initializer` (a seeded one repeats); the others, e.g. learned_2d's
            # column table beside its row table, from copies with seeds of their own.
            initializer = fresh_copy(self.initializer) if index else self.initializer
            setattr(self, name, self.add_weight(name=name, shape=shape, initializer=initializer))

    def grid_table(self, rows, cols, width, tables=None):
        """The `(rows * cols, width)` embeddings of a grid, or None for "none".

        Args:
            rows, cols: ints or scalar tensors, the grid to embed.
            width: int. The embedding width.
            tables: optional replacement for the layer's weights (the same
                names), e.g. float64 arrays when resizing a checkpoint.
        """
        tables = tables or {w.name: w for w in self.weights}
        return self.position.table(
            tables, (rows, cols), self.grid_size, self.prefix_rows, width, self.interpolation
        )

    def resized_weights(self, grid_size):
        """Weights of this layer resampled for `grid_size`, as numpy arrays.

        The prefix rows of `learned_1d` are kept; grids are resampled with
        `self.interpolation` in float64 (the official code uses
        `scipy.ndimage.zoom(order=1)`). Returns a dict keyed by weight name.
        """
        tables = {w.name: np.asarray(w.numpy(), np.float64) for w in self.weights}
        return self.position.resize(
            tables, to_pair(grid_size, "grid_size"), self.prefix_rows, self.interpolation, self.grid_size
        )

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
        prefix_table = self.position.prefix_table({w.name: w for w in self.weights}, self.prefix_rows)
        if prefix_table is not None:
            prefix_tokens = prefix_tokens + ops.cast(prefix_table, self.compute_dtype)
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
