"""Masked patch prediction's corruption of the patch embeddings (Dosovitskiy et al., 2021, Appendix B.1.2).

Each patch is chosen with probability `rate` (50%). A chosen patch's
embedding is replaced by a learned mask embedding with probability
`mask_fraction` (80%), by the embedding of a random other patch of the batch
with probability `random_fraction` (10%), and kept otherwise (10%), as BERT
corrupts its tokens. Every chosen patch is a prediction target, the kept
ones included.
"""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_vit")
class PatchCorruption(keras.layers.Layer):
    """Corrupts patch embeddings for masked patch prediction.

    The draws are independent per patch, so each image has `rate` of its
    patches chosen in expectation. The layer corrupts in training and at
    inference alike: it belongs to the pre-training network only.

    Args:
        rate: float in (0, 1]. Probability that a patch is chosen. Defaults to 0.5.
        mask_fraction: float. Of the chosen, the share given the mask embedding. Defaults to 0.8.
        random_fraction: float. Of the chosen, the share given another patch's embedding. Defaults to 0.1.
        seed: int or None. Seed of the draws.

    Call arguments:
        patches: `(batch, height, width, hidden)` patch embeddings.

    Returns:
        `(corrupted, chosen)`: the embeddings with the chosen patches corrupted, and a
        `(batch, height, width)` float mask, 1 where a patch was chosen.

    Example:
    >>> corrupted, chosen = PatchCorruption(seed=0)(np.ones((2, 4, 4, 8), "float32"))
    >>> tuple(corrupted.shape), tuple(chosen.shape)
    ((2, 4, 4, 8), (2, 4, 4))
    """

    def __init__(self, rate=0.5, mask_fraction=0.8, random_fraction=0.1, seed=None, **kwargs):
        super().__init__(**kwargs)
        if not 0.0 < float(rate) <= 1.0:
            raise ValueError(f"`rate` must be in (0, 1]; received rate={rate}")
        if not (0.0 <= mask_fraction and 0.0 <= random_fraction and mask_fraction + random_fraction <= 1.0):
            raise ValueError("`mask_fraction` and `random_fraction` must be >= 0 with a sum <= 1; received "
                             f"mask_fraction={mask_fraction}, random_fraction={random_fraction}")
        self.rate, self.mask_fraction, self.random_fraction = float(rate), float(mask_fraction), float(random_fraction)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)

    def build(self, input_shape):
        # Zero-initialised, as BERT's [MASK] row starts like any embedding near zero.
        self.mask_embedding = self.add_weight(shape=(input_shape[-1],), initializer="zeros", name="mask_embedding")

    def call(self, patches):
        shape = ops.shape(patches)
        batch, height, width, hidden = shape[0], shape[1], shape[2], shape[3]
        count = batch * height * width
        flat = ops.reshape(patches, (count, hidden))
        chosen = keras.random.uniform((count,), seed=self.seed_generator) < self.rate
        how = keras.random.uniform((count,), seed=self.seed_generator)
        masked = chosen & (how < self.mask_fraction)
        randomised = chosen & (how >= self.mask_fraction) & (how < self.mask_fraction + self.random_fraction)
        # A uniform draw among the other count - 1 patches: skip one's own index.
        other = ops.cast(keras.random.uniform((count,), seed=self.seed_generator) * ops.cast(count - 1, "float32"),
                         "int32")
        other = ops.minimum(other, count - 2)
        other = ops.where(other >= ops.arange(count, dtype="int32"), other + 1, other)
        other = ops.minimum(other, count - 1)  # a batch of one patch has no other: it keeps its own
        flat = ops.where(randomised[:, None], ops.take(flat, other, axis=0), flat)
        flat = ops.where(masked[:, None], ops.cast(self.mask_embedding, flat.dtype)[None, :], flat)
        return (ops.reshape(flat, shape),
                ops.reshape(ops.cast(chosen, "float32"), (batch, height, width)))

    def compute_output_shape(self, input_shape):
        return input_shape, input_shape[:3]

    def get_config(self):
        return {**super().get_config(), "rate": self.rate, "mask_fraction": self.mask_fraction,
                "random_fraction": self.random_fraction, "seed": self.seed}
