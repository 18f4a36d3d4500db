"""`"sincos_2d"`: fixed sines and cosines of the column and row index.

big_vision's `posemb_sincos_2d` (temperature 10000). No weights: the table
is computed for whatever grid the model sees, so it needs no resize and has
no checkpoint key; prefix tokens get no position.
"""

from keras import ops

from keras_vit.positions.base import PositionKind


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


class SinCos2D(PositionKind):
    name = "sincos_2d"
    adds_to_tokens = True

    def weight_shapes(self, width, grid_size, prefix_rows, num_heads=None):
        if width % 4:
            raise ValueError(f"sincos_2d position embeddings need hidden_size divisible by 4; received {width}")
        return {}

    def table(self, weights, size, grid_size, prefix_rows, width, interpolation):
        return sincos_2d(*size, width)


KIND = SinCos2D()
