"""The distillation token of DeiT (Touvron et al., 2021, Section 4).

A second prefix token, placed after the class token, whose output is trained
to match a teacher's prediction. It behaves as the class token; only its
initialisation differs (DeiT draws both tokens from a truncated normal, 0.02).
"""

import keras

from keras_vit.layers.class_token import ClassToken


@keras.saving.register_keras_serializable(package="keras_vit")
class DistillationToken(ClassToken):
    """A learned `(1, 1, hidden_size)` distillation token for every example.

    Args:
        initializer: initializer of the token. Defaults to a truncated normal
            with standard deviation 0.02, as DeiT.

    Example:
    >>> tuple(DistillationToken()(np.zeros((2, 4, 4, 16))).shape)
    (2, 1, 16)
    """

    def __init__(self, initializer=None, **kwargs):
        if initializer is None:
            initializer = keras.initializers.TruncatedNormal(stddev=0.02)
        super().__init__(initializer=initializer, **kwargs)
