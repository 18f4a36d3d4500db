"""PatchDropout (Liu et al., WACV 2023, "PatchDropout: Economizing Vision Transformers Using Patch Dropout").

In training each image keeps a random subset of its patch tokens, and the
encoder blocks run on fewer tokens: at rate 0.5 about half the FLOPs and
activation memory (the paper, Sec. 3; FLIP trains CLIP so). The count is
timm's `PatchDropout`'s, max(1, int(N (1 - rate))) of N patches, the same
for every image, so shapes stay static for XLA and TPUs. The prefix tokens
(class, distillation, registers) are always kept, and the kept patches keep
their order (timm's `ordered=True`): a kept set's indices that keep every
token are then the identity, which rotary positions rely on. At inference
the layer returns its input.
"""

import keras
from keras import ops

from keras_vit.checks import check_bool, check_count, check_float


def num_kept(num_patches, rate):
    """The patches an image keeps: max(1, int(num_patches (1 - rate))), timm's count."""
    return max(1, int(num_patches * (1.0 - rate)))


@keras.saving.register_keras_serializable(package="keras_vit")
class PatchDropout(keras.layers.Layer):
    """Keeps a random subset of the patch tokens of each example in training.

    Each example draws its own subset of `num_kept(N, rate)` of its `N`
    patch tokens, uniformly, from the layer's seed generator (a variable, so
    a resumed run draws what the uninterrupted one drew). The first
    `num_prefix_tokens` tokens are always kept, first, as they are.

    Args:
        rate: float in [0, 1). The share of patch tokens dropped. Defaults to 0.5.
        num_prefix_tokens: int. Tokens before the patches, always kept. Defaults to 1.
        return_indices: bool. Also return each kept token's place in the
            input sequence, for rotary positions that must follow their
            tokens. Defaults to False.
        seed: int or None. Seed of the draws.

    Call arguments:
        tokens: `(batch, num_prefix_tokens + N, width)`, N known while tracing in training.
        training: bool. Only drops while training; otherwise the input is returned.

    Returns:
        `(batch, num_prefix_tokens + num_kept(N, rate), width)` in training,
        the input otherwise; with `return_indices`, also the `(batch, tokens)`
        int32 places of the tokens returned (at inference, 0, 1, 2, ...).

    Example:
    >>> layer = PatchDropout(0.5, num_prefix_tokens=1, seed=0)
    >>> tuple(layer(np.zeros((2, 17, 8)), training=True).shape), tuple(layer(np.zeros((2, 17, 8))).shape)
    ((2, 9, 8), (2, 17, 8))
    """

    def __init__(self, rate=0.5, num_prefix_tokens=1, return_indices=False, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.rate = float(check_float(rate, "rate", 0.0, 1))
        self.num_prefix_tokens = check_count(num_prefix_tokens, "num_prefix_tokens")
        self.return_indices = check_bool(return_indices, "return_indices")
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)

    def call(self, tokens, training=None):
        if not training or not self.rate:
            return (tokens, self._places(tokens)) if self.return_indices else tokens
        prefix, length = self.num_prefix_tokens, tokens.shape[1]
        if length is None or length <= prefix:
            raise ValueError(f"PatchDropout keeps a fixed count of patch tokens, so training needs more than "
                             f"num_prefix_tokens={prefix} tokens, their number known while tracing; received tokens "
                             f"of shape {tuple(tokens.shape)}")
        batch = ops.shape(tokens)[0]
        # The top k of uniform noise: a uniform subset of k, drawn per example.
        noise = keras.random.uniform((batch, length - prefix), seed=self.seed_generator)
        _, kept = ops.top_k(noise, num_kept(length - prefix, self.rate), sorted=False)
        kept = ops.sort(ops.cast(kept, "int32"), axis=-1) + prefix  # in their order, after the prefix
        places = ops.concatenate([ops.broadcast_to(ops.arange(prefix, dtype="int32"), (batch, prefix)), kept], axis=1)
        dropped = ops.take_along_axis(tokens, places[:, :, None], axis=1)
        return (dropped, places) if self.return_indices else dropped

    def _places(self, tokens):
        """0, 1, 2, ... for every token of every example: the places of tokens kept whole."""
        length = tokens.shape[1] if tokens.shape[1] is not None else ops.shape(tokens)[1]
        return ops.broadcast_to(ops.arange(length, dtype="int32")[None, :], (ops.shape(tokens)[0], length))

    def compute_output_shape(self, input_shape):
        # As at inference, the shape a functional model is built with; training returns fewer tokens.
        return (input_shape, tuple(input_shape[:2])) if self.return_indices else input_shape

    def compute_output_spec(self, tokens, training=None):
        spec = keras.KerasTensor(tokens.shape, dtype=tokens.dtype)
        return (spec, keras.KerasTensor(tokens.shape[:2], dtype="int32")) if self.return_indices else spec

    def get_config(self):
        return {**super().get_config(), "rate": self.rate, "num_prefix_tokens": self.num_prefix_tokens,
                "return_indices": self.return_indices, "seed": self.seed}
