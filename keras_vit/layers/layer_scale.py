"""LayerScale (Touvron et al., "Going deeper with Image Transformers", 2021): a learned per-channel scale.

A residual branch's output times `gamma`, a `(width,)` weight that starts at
`init_value` (timm's `LayerScale`, `init_values`; DeiT III, DINOv2), so a deep
model starts close to the identity.
"""

import keras

from keras_vit.checks import check_float


@keras.saving.register_keras_serializable(package="keras_vit")
class LayerScale(keras.layers.Layer):
    """Multiplies `(..., width)` inputs by a learned `(width,)` scale `gamma`.

    Args:
        init_value: float > 0. The value every channel's scale starts at.

    Example:
    >>> tuple(LayerScale(1e-5)(np.ones((2, 5, 8))).shape)
    (2, 5, 8)
    """

    def __init__(self, init_value, **kwargs):
        super().__init__(**kwargs)
        self.init_value = float(check_float(init_value, "init_value", 0.0, low_open=True))

    def build(self, input_shape):
        self.gamma = self.add_weight(name="gamma", shape=(input_shape[-1],),
                                     initializer=keras.initializers.Constant(self.init_value))

    def call(self, inputs):
        return inputs * self.gamma

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "init_value": self.init_value}
