"""The model's norm layer, one kind for every norm of a model (`ViTConfig.norm_layer`).

LayerNorm (`gamma`, `beta`), or RMSNorm: `x / sqrt(mean(x^2) + eps) * scale`,
no mean taken and no bias (timm's `RmsNorm`, AIMv2), which is Keras' own
`RMSNormalization` (its `scale` weight).
"""

import keras

from keras_vit.checks import check_choice
from keras_vit.config import NORM_LAYERS

# The layer classes of each kind, for code that finds a model's norms.
NORM_CLASSES = (keras.layers.LayerNormalization, keras.layers.RMSNormalization)


def norm(kind, epsilon, name, dtype=None):
    """A norm over the last axis: `kind` "layer_norm" or "rms_norm", with `epsilon`."""
    kind = check_choice(kind, NORM_LAYERS, "norm_layer")
    if kind == "rms_norm":
        return keras.layers.RMSNormalization(epsilon=epsilon, dtype=dtype, name=name)
    return keras.layers.LayerNormalization(epsilon=epsilon, dtype=dtype, name=name)

