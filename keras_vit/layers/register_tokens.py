"""Register tokens (Darcet et al., "Vision Transformers Need Registers", ICLR 2024).

Extra learned prefix tokens that the blocks may use as scratch space; no
output reads them: pooling leaves them out as it leaves out the class token.
timm (`reg_tokens`, e.g. `vit_base_patch16_reg4_gap_256`) places them after
the class token; `PositionEmbedding` gives them a position exactly when it
gives the class token one (timm's `no_embed_class`).
"""

import keras
from keras import ops

from keras_vit.checks import check_count


@keras.saving.register_keras_serializable(package="keras_vit")
class RegisterTokens(keras.layers.Layer):
    """`count` learned `(hidden_size,)` tokens, repeated for every example.

    Args:
        count: int >= 1. The number of register tokens.
        initializer: initializer of the tokens. Defaults to a normal with
            standard deviation 1e-6, as timm.

    Call arguments:
        inputs: any tensor `(batch, ..., hidden_size)`, usually the patch
            grid; only its batch size and width are used.

    Returns:
        `(batch, count, hidden_size)` in the compute dtype.

    Example:
    >>> tuple(RegisterTokens(4)(np.zeros((2, 4, 4, 16))).shape)
    (2, 4, 16)
    """

    def __init__(self, count, initializer=None, **kwargs):
        super().__init__(**kwargs)
        self.count = check_count(count, "count", minimum=1)
        self.initializer = keras.initializers.get(initializer or keras.initializers.RandomNormal(stddev=1e-6))

    def build(self, input_shape):
        if input_shape[-1] is None:
            raise ValueError(f"The token width (last axis) must be known; received input_shape={tuple(input_shape)}")
        self.tokens = self.add_weight(name="tokens", shape=(1, self.count, input_shape[-1]),
                                      initializer=self.initializer)

    def call(self, inputs):
        tokens = ops.cast(self.tokens, self.compute_dtype)
        return ops.broadcast_to(tokens, (ops.shape(inputs)[0], self.count, tokens.shape[-1]))

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.count, input_shape[-1])

    def get_config(self):
        return {**super().get_config(), "count": self.count,
                "initializer": keras.initializers.serialize(self.initializer)}
