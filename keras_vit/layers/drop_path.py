"""Stochastic depth (Huang et al., 2016), as DeiT and AugReg train ViTs.

During training each example skips the residual branch with probability
`rate`; kept branches are scaled by 1 / (1 - rate) so the expectation is
unchanged. At inference the layer is the identity.
"""

import keras
from keras import ops


def linear_rate(rate, index, num_layers):
    """Stochastic depth of block `index` of `num_layers`: from 0 at the first
    block up to `rate` at the last (DeiT's schedule). `index` may be a tensor."""
    return rate * index / max(num_layers - 1, 1)


@keras.saving.register_keras_serializable(package="keras_vit")
class DropPath(keras.layers.Layer):
    """Drops a whole residual branch per example.

    Args:
        rate: float in [0, 1). Probability of dropping. Defaults to 0.
        seed: int or None. Seed of the random draws.

    Call arguments:
        inputs: `(batch, ...)` output of a residual branch.
        training: bool. Only drops while training.
        rate: None, or this call's rate (a float or a scalar tensor) in
            place of the layer's: `ScannedEncoder` runs one layer for every
            block, each at its own rate.

    Example:
    >>> tuple(DropPath(0.5)(np.ones((4, 3)), training=False).shape)
    (4, 3)
    """

    def __init__(self, rate=0.0, seed=None, **kwargs):
        super().__init__(**kwargs)
        if not 0.0 <= float(rate) < 1.0:
            raise ValueError(f"`rate` must be in [0, 1); received rate={rate}")
        self.rate = float(rate)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed) if self.rate else None

    def call(self, inputs, training=None, rate=None):
        if rate is None:
            rate = self.rate
        elif self.seed_generator is None:
            raise ValueError(
                f"DropPath(rate=0) draws no random numbers, so it takes no rate per call; received rate={rate}"
            )
        if not training or (isinstance(rate, (int, float)) and not rate):
            return inputs
        # The mask in float32 whatever the compute dtype: a per-call rate comes
        # in the activations' dtype (bfloat16 under mixed precision).
        keep = 1.0 - ops.cast(rate, "float32")
        shape = (ops.shape(inputs)[0],) + (1,) * (len(inputs.shape) - 1)
        mask = ops.floor(keep + keras.random.uniform(shape, dtype="float32", seed=self.seed_generator))
        return inputs * ops.cast(mask / keep, inputs.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "rate": self.rate, "seed": self.seed}
