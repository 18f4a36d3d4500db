"""Pooling of the encoded token sequence into one vector per image.

`"token"` takes the class token (Section 3.1); `"gap"` averages the patch
tokens (the paper's global-average-pooling alternative, Appendix D.3; the
official code averages after the final LayerNorm); `"max"` is offered for
feature extraction as `keras.applications` does. `"token_and_gap"` puts the
class token and the mean of the patch tokens side by side (DINOv2's
classifier input, `Dinov2ForImageClassification`).
"""

import keras
from keras import ops

from keras_vit.checks import check_choice, check_count

MODES = ("token", "distillation", "gap", "max", "token_and_gap")


@keras.saving.register_keras_serializable(package="keras_vit")
class SequencePooling(keras.layers.Layer):
    """Reduces `(batch, tokens, width)` to `(batch, width)` (`(batch, 2 * width)` for `"token_and_gap"`).

    Args:
        mode: str. `"token"` (the first token), `"distillation"` (the
            second), `"gap"` (mean of the patch tokens), `"max"` (max over
            the patch tokens) or `"token_and_gap"` (the first token, then the
            mean of the patch tokens). Defaults to `"token"`.
        num_prefix_tokens: int. Tokens before the patches, left out of
            `"gap"` and `"max"`. Defaults to 1.

    Example:
    >>> tuple(SequencePooling("gap", num_prefix_tokens=0)(np.ones((2, 5, 8))).shape)
    (2, 8)
    """

    def __init__(self, mode="token", num_prefix_tokens=1, **kwargs):
        super().__init__(**kwargs)
        self.mode = check_choice(mode, MODES, "mode")
        self.num_prefix_tokens = check_count(num_prefix_tokens, "num_prefix_tokens")
        # The token a mode pools must be a prefix token: a patch's would be pooled without a word.
        needed = {"token": 1, "distillation": 2, "token_and_gap": 1}.get(self.mode, 0)
        if self.num_prefix_tokens < needed:
            raise ValueError(
                f"mode={self.mode!r} pools prefix token {needed - 1} and needs num_prefix_tokens >= {needed}; "
                f"received num_prefix_tokens={self.num_prefix_tokens}"
            )

    def call(self, inputs):
        if self.mode in ("token", "distillation"):  # the class token, or DeiT's second prefix token
            return inputs[:, 0 if self.mode == "token" else 1]
        patches = inputs[:, self.num_prefix_tokens :]
        if self.mode == "gap":
            return ops.mean(patches, axis=1)
        if self.mode == "token_and_gap":
            return ops.concatenate([inputs[:, 0], ops.mean(patches, axis=1)], axis=-1)
        return ops.max(patches, axis=1)

    def compute_output_shape(self, input_shape):
        width = input_shape[-1]
        return (input_shape[0], 2 * width if self.mode == "token_and_gap" and width is not None else width)

    def get_config(self):
        return {**super().get_config(), "mode": self.mode, "num_prefix_tokens": self.num_prefix_tokens}
