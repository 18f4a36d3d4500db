"""The tokens' rotary coordinates for a patch grid known only at run time.

A `dynamic_image_size` model with rotary positions learns the grid's rows
and columns from its patches; this layer turns them into every token's
(y, x) coordinates (`keras_vit.positions.rotary.coordinates`) once, and each
block's attention turns its queries and keys by them. A fixed grid needs no
such layer: the attention computes its coordinates from `grid_size`.
"""

import keras
from keras import ops

from keras_vit.checks import check_choice, check_count, to_pair
from keras_vit.positions import rotary


@keras.saving.register_keras_serializable(package="keras_vit")
class RotaryCoordinates(keras.layers.Layer):
    """`(prefix + rows * cols, 2)` float32 coordinates of the tokens of a `(batch, rows, cols, width)` grid.

    Args:
        rotary_embedding: a kind of `keras_vit.positions.rotary`.
        num_prefix_tokens: int. Tokens before the patches, at (0, 0).
        rope_reference_grid: `"rope_eva"`'s reference grid; else None.

    Example:
    >>> tuple(RotaryCoordinates("rope_axial", 1)(np.zeros((2, 3, 4, 8))).shape)
    (13, 2)
    """

    def __init__(self, rotary_embedding, num_prefix_tokens=0, rope_reference_grid=None, **kwargs):
        super().__init__(**kwargs)
        self.rotary_embedding = check_choice(rotary_embedding, rotary.NAMES, "rotary_embedding")
        self.num_prefix_tokens = check_count(num_prefix_tokens, "num_prefix_tokens")
        self.rope_reference_grid = None if rope_reference_grid is None else to_pair(rope_reference_grid,
                                                                                     "rope_reference_grid")

    def call(self, patches):
        rows, cols = (n if n is not None else ops.shape(patches)[axis]
                      for axis, n in ((1, patches.shape[1]), (2, patches.shape[2])))
        return ops.cast(rotary.coordinates(self.rotary_embedding, (rows, cols), self.num_prefix_tokens,
                                           self.rope_reference_grid), "float32")

    def compute_output_shape(self, input_shape):
        rows, cols = input_shape[1:3]
        return (None if rows is None or cols is None else self.num_prefix_tokens + rows * cols, 2)

    def get_config(self):
        return {**super().get_config(), "rotary_embedding": self.rotary_embedding,
                "num_prefix_tokens": self.num_prefix_tokens, "rope_reference_grid": self.rope_reference_grid}
