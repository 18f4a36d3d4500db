"""The learnable class token of Section 3.1 (BERT's [class] token).

Its state at the encoder output is the image representation for the
`"token"` classifier. The layer returns the token broadcast to the batch;
`PositionEmbedding` puts prefix tokens in front of the patch sequence, so the
order of prefix tokens and position rows is decided in one place.
"""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_vit")
class ClassToken(keras.layers.Layer):
    """A learned `(1, 1, hidden_size)` token, repeated for every example.

    Args:
        initializer: initializer of the token. Defaults to `"zeros"`, as the
            official code (`cls` in the checkpoints).

    Call arguments:
        inputs: any tensor `(batch, ..., hidden_size)`, usually the patch
            grid; only its batch size and width are used.

    Returns:
        `(batch, 1, hidden_size)` in the compute dtype.

    Example:
    >>> tuple(ClassToken()(np.zeros((2, 4, 4, 16))).shape)
    (2, 1, 16)
    """

    def __init__(self, initializer="zeros", **kwargs):
        super().__init__(**kwargs)
        self.initializer = keras.initializers.get(initializer)

    def build(self, input_shape):
        if input_shape[-1] is None:
            raise ValueError(
                f"The token width (last axis) must be known; received input_shape={tuple(input_shape)}"
            )
        self.token = self.add_weight(
            name="token", shape=(1, 1, input_shape[-1]), initializer=self.initializer
        )

    def call(self, inputs):
        token = ops.cast(self.token, self.compute_dtype)
        return ops.broadcast_to(token, (ops.shape(inputs)[0], 1, token.shape[-1]))

    def compute_output_shape(self, input_shape):
        return (input_shape[0], 1, input_shape[-1])

    def get_config(self):
        return {
            **super().get_config(),
            "initializer": keras.initializers.serialize(self.initializer),
        }
