"""Multi-head self-attention in the official layout, with relative positions.

The kernels are shaped as in google-research/vision_transformer
(`MultiHeadDotProductAttention_1/{query,key,value}/kernel`: (D, heads,
head_dim); `out/kernel`: (heads, head_dim, D)), so official checkpoints map
one to one. As Flax, the query is divided by sqrt(head_dim) before the dot
products.

Relative attention (Appendix D.4 of Dosovitskiy et al., 2021): every
query-key offset has a learned embedding; an extra attention uses the
original queries against these embeddings as keys, and its logits are added
to the content logits before the softmax.
- `"relative"`: offsets `p_q - p_k` along the flattened sequence (prefix
  tokens included), as in the paper: 2L - 1 embeddings for L tokens.
- `"relative_2d"`: (row, column) offsets between patches, (2R-1)(2C-1)
  embeddings, plus three for prefix-to-patch, patch-to-prefix and
  prefix-to-prefix pairs (BEiT's convention).
The offset logits are computed once per offset, `(batch, heads, L,
offsets)`, then gathered to `(batch, heads, L, L)`, so the cost stays that of
one more attention matmul.
"""

import math

import keras
import numpy as np
from keras import ops

from keras_vit.layers.utils import check_choice, to_pair
from keras_vit.resize import INTERPOLATIONS, resize_grid, resize_sequence

RELATIVE_POSITIONS = (None, "relative", "relative_2d")


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


@keras.saving.register_keras_serializable(package="keras_vit")
class MultiHeadSelfAttention(keras.layers.Layer):
    """Multi-head dot-product self-attention over `(batch, tokens, width)`.

    Args:
        num_heads: int. Number of heads; must divide the input width.
        attention_dropout_rate: float. Dropout on the attention weights.
            Defaults to 0.
        relative_position: None, `"relative"` or `"relative_2d"`. Adds the
            logits of relative attention. Defaults to None.
        grid_size: int or (rows, cols). Patch grid the relative tables are
            made for; required with `relative_position`.
        num_prefix_tokens: int. Tokens before the patches. Defaults to 0.
        interpolation: `"bilinear"` or `"bicubic"`: how relative tables are
            resampled for another sequence length. Defaults to `"bilinear"`.

    Call arguments:
        inputs: `(batch, tokens, width)`.
        training: bool. Whether dropout is active.
        return_attention_scores: bool. Also return the attention weights,
            `(batch, heads, tokens, tokens)`.

    Returns:
        `(batch, tokens, width)`, and the weights if asked for.

    Example:
    >>> layer = MultiHeadSelfAttention(num_heads=4)
    >>> tuple(layer(np.zeros((2, 17, 64))).shape)
    (2, 17, 64)
    """

    def __init__(
        self,
        num_heads,
        attention_dropout_rate=0.0,
        relative_position=None,
        grid_size=None,
        num_prefix_tokens=0,
        interpolation="bilinear",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if int(num_heads) < 1:
            raise ValueError(f"`num_heads` must be a positive int; received num_heads={num_heads}")
        self.num_heads = int(num_heads)
        self.attention_dropout_rate = float(attention_dropout_rate)
        self.relative_position = check_choice(
            relative_position, RELATIVE_POSITIONS, "relative_position"
        )
        if relative_position and grid_size is None:
            raise ValueError(
                f"relative_position={relative_position!r} needs `grid_size`; received grid_size=None"
            )
        self.grid_size = None if grid_size is None else to_pair(grid_size, "grid_size")
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.interpolation = check_choice(interpolation, INTERPOLATIONS, "interpolation")
        self.dropout = keras.layers.Dropout(
            self.attention_dropout_rate, dtype=self.dtype_policy, name="dropout"
        )

    def build(self, input_shape):
        if len(input_shape) != 3 or input_shape[-1] is None:
            raise ValueError(
                "MultiHeadSelfAttention expects (batch, tokens, width) with a known width; "
                f"received input_shape={tuple(input_shape)}"
            )
        width = input_shape[-1]
        if width % self.num_heads:
            raise ValueError(
                f"The width must be divisible by `num_heads`={self.num_heads}; received width={width}"
            )
        head_dim = width // self.num_heads
        # Xavier-uniform over the flat (width, heads * head_dim) matrix, as
        # the official code initialises its DenseGeneral kernels.
        limit = math.sqrt(6.0 / (width + self.num_heads * head_dim))
        kernel_init = keras.initializers.RandomUniform(-limit, limit)
        projection = (width, self.num_heads, head_dim)
        for name in ("query", "key", "value"):
            setattr(self, f"{name}_kernel", self.add_weight(
                name=f"{name}_kernel", shape=projection, initializer=kernel_init))
            setattr(self, f"{name}_bias", self.add_weight(
                name=f"{name}_bias", shape=projection[1:], initializer="zeros"))
        self.output_kernel = self.add_weight(
            name="output_kernel", shape=(self.num_heads, head_dim, width), initializer=kernel_init
        )
        self.output_bias = self.add_weight(name="output_bias", shape=(width,), initializer="zeros")
        table_init = keras.initializers.RandomNormal(stddev=0.02)
        if self.relative_position == "relative":
            length = self.num_prefix_tokens + math.prod(self.grid_size)
            self.relative_embedding = self.add_weight(
                name="relative_embedding",
                shape=(2 * length - 1, self.num_heads, head_dim),
                initializer=table_init,
            )
        elif self.relative_position == "relative_2d":
            rows, cols = self.grid_size
            self.relative_embedding = self.add_weight(
                name="relative_embedding",
                shape=(2 * rows - 1, 2 * cols - 1, self.num_heads, head_dim),
                initializer=table_init,
            )
            self.prefix_relative_embedding = self.add_weight(
                name="prefix_relative_embedding",
                shape=(3, self.num_heads, head_dim),
                initializer=table_init,
            )
        self.dropout.build(None)

    def relative_logits(self, query):
        """Logits of the relative attention, `(batch, heads, L, L)`."""
        static_length = query.shape[1]
        length = ops.shape(query)[1] if static_length is None else static_length
        if self.relative_position == "relative":
            table = self.relative_embedding
            if static_length != (table.shape[0] + 1) // 2:
                table = resize_sequence(table, 2 * length - 1, self.interpolation)
            positions = ops.arange(length, dtype="int32")
            index = positions[:, None] - positions[None, :] + length - 1
        else:
            if length != self.num_prefix_tokens + math.prod(self.grid_size):
                raise ValueError(
                    f"relative_2d attention was built for the grid {self.grid_size} with "
                    f"{self.num_prefix_tokens} prefix tokens ({self.num_prefix_tokens + math.prod(self.grid_size)} "
                    f"tokens); received {length} tokens. Build the model for the new resolution "
                    "and load the weights into it (the tables are resized on load)."
                )
            table = ops.concatenate(
                [
                    ops.reshape(self.relative_embedding, (-1, *self.relative_embedding.shape[2:])),
                    self.prefix_relative_embedding,
                ],
                axis=0,
            )
            index = relative_2d_index(self.grid_size, self.num_prefix_tokens)
        table = ops.cast(table, query.dtype)
        per_offset = ops.einsum("bqhd,ohd->bhqo", query, table)
        return ops.take_along_axis(per_offset, ops.convert_to_tensor(index)[None, None], axis=-1)

    def resized_weights(self, grid_size):
        """Relative tables resampled for `grid_size`, as float32 numpy arrays.

        Returns a dict keyed by weight name (empty without relative position).
        """
        rows, cols = to_pair(grid_size, "grid_size")
        if self.relative_position == "relative":
            table = np.asarray(self.relative_embedding.numpy(), np.float64)
            length = self.num_prefix_tokens + rows * cols
            resized = resize_sequence(table, 2 * length - 1, self.interpolation)
            return {"relative_embedding": np.asarray(resized, np.float32)}
        if self.relative_position == "relative_2d":
            table = np.asarray(self.relative_embedding.numpy(), np.float64)
            resized = resize_grid(table, (2 * rows - 1, 2 * cols - 1), self.interpolation)
            return {
                "relative_embedding": np.asarray(resized, np.float32),
                "prefix_relative_embedding": self.prefix_relative_embedding.numpy(),
            }
        return {}

    def call(self, inputs, training=None, return_attention_scores=False):
        def project(name):
            kernel = getattr(self, f"{name}_kernel")
            return ops.einsum("btd,dhk->bthk", inputs, kernel) + getattr(self, f"{name}_bias")

        head_dim = self.query_kernel.shape[-1]
        query = project("query") / ops.cast(math.sqrt(head_dim), inputs.dtype)
        key, value = project("key"), project("value")
        logits = ops.einsum("bqhd,bkhd->bhqk", query, key)
        if self.relative_position:
            logits = logits + self.relative_logits(query)
        # Softmax in float32: under mixed precision bf16 logits lose the
        # small differences that decide the attention pattern.
        weights = ops.cast(ops.softmax(ops.cast(logits, "float32"), axis=-1), inputs.dtype)
        attended = ops.einsum(
            "bhqk,bkhd->bqhd", self.dropout(weights, training=training), value
        )
        outputs = ops.einsum("bqhd,hdo->bqo", attended, self.output_kernel) + self.output_bias
        return (outputs, weights) if return_attention_scores else outputs

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "attention_dropout_rate": self.attention_dropout_rate,
            "relative_position": self.relative_position,
            "grid_size": self.grid_size,
            "num_prefix_tokens": self.num_prefix_tokens,
            "interpolation": self.interpolation,
        }
