"""`intermediates`: a Keras model of the tokens each encoder block outputs.

What timm's `forward_intermediates` and big_vision's named intermediates
give (features for dense heads, probes, layer-wise analyses), as a plain
functional Keras model built on the model's own layers: it shares their
weights, runs at any resolution the model accepts, and exports as the
classifier does.
"""

import numbers

import keras
from keras import ops

from keras_vit.analysis import blocks as encoder
from keras_vit.checks import check_choice
from keras_vit.layers.scanned_encoder import block_name

OUTPUTS = ("tokens", "grid")


@keras.saving.register_keras_serializable(package="keras_vit")
class SplitPrefixTokens(keras.layers.Layer):
    """Splits `(batch, tokens, width)` into the prefix tokens and the patch tokens.

    Args:
        num_prefix_tokens: int. Tokens before the patches.

    Returns:
        `{"prefix_tokens": (batch, num_prefix_tokens, width), "patch_tokens":
        (batch, patches, width)}`.

    Example:
    >>> split = SplitPrefixTokens(1)(np.zeros((2, 5, 8)))
    >>> tuple(split["prefix_tokens"].shape), tuple(split["patch_tokens"].shape)
    ((2, 1, 8), (2, 4, 8))
    """

    def __init__(self, num_prefix_tokens, **kwargs):
        super().__init__(**kwargs)
        self.num_prefix_tokens = int(num_prefix_tokens)

    def call(self, tokens):
        n = self.num_prefix_tokens
        return {"prefix_tokens": tokens[:, :n], "patch_tokens": tokens[:, n:]}

    def get_config(self):
        return {**super().get_config(), "num_prefix_tokens": self.num_prefix_tokens}


@keras.saving.register_keras_serializable(package="keras_vit")
class PatchTokenGrid(keras.layers.Layer):
    """The patch tokens of a sequence as the `(batch, rows, cols, width)` grid they came from.

    Args:
        num_prefix_tokens: int. Tokens before the patches, dropped.

    Call arguments:
        tokens: `(batch, num_prefix_tokens + rows * cols, width)`.
        patch_grid: `(batch, rows, cols, any)`, e.g. the patch embedding;
            only its shape is read, so any resolution works.

    Example:
    >>> grid = PatchTokenGrid(1)(np.zeros((2, 7, 8)), np.zeros((2, 2, 3, 8)))
    >>> tuple(grid.shape)
    (2, 2, 3, 8)
    """

    def __init__(self, num_prefix_tokens, **kwargs):
        super().__init__(**kwargs)
        self.num_prefix_tokens = int(num_prefix_tokens)

    def call(self, tokens, patch_grid):
        shape = ops.shape(patch_grid)
        return ops.reshape(tokens[:, self.num_prefix_tokens:], (shape[0], shape[1], shape[2], tokens.shape[-1]))

    def compute_output_shape(self, tokens_shape, patch_grid_shape):
        return (tokens_shape[0], patch_grid_shape[1], patch_grid_shape[2], tokens_shape[-1])

    def get_config(self):
        return {**super().get_config(), "num_prefix_tokens": self.num_prefix_tokens}


def intermediates(model, indices=None, norm=False, output="tokens"):
    """A Keras model from the model's images to the tokens of chosen encoder blocks.

    Built on the model's own layers (weights shared, not copied). Blocks of a
    `ScannedEncoder` are run one by one on its stacked weights
    (`ScannedEncoder.call_block`); such a model exports
    (`model.export`, `tf.function`) but does not save as `.keras`, while the
    one of an unrolled model does.

    Args:
        model: a keras_vit ViT (any classifier, resolution, encoder).
        indices: None (every block), an int or a sequence of ints; negative
            ones count from the last block (-1). Defaults to None.
        norm: bool. Apply the model's final sequence norm (`encoder_norm`) to
            each output, as the encoder's last output is normalised. A model
            with `fc_norm` normalises only its pooled vector, so it has no
            such norm: a ValueError. Defaults to False.
        output: `"tokens"`: per block a dict `{"prefix_tokens": (batch,
            prefix, width), "patch_tokens": (batch, rows * cols, width)}`;
            `"grid"`: per block the patch tokens `(batch, rows, cols,
            width)`, for dense heads. Defaults to `"tokens"`.

    Returns:
        A functional `keras.Model` with the model's inputs and a dict of
        outputs keyed by block, `"encoder_block_{i}"` (`i` from 0).

    Example:
    >>> vit = keras_vit.ViT(patch_size=4, hidden_size=8, mlp_dim=16, num_heads=2, num_layers=3, image_size=(8, 12))
    >>> grids = intermediates(vit, indices=[0, -1], output="grid")(np.zeros((1, 8, 12, 3)))
    >>> {name: tuple(grid.shape) for name, grid in grids.items()}
    {'encoder_block_0': (1, 2, 3, 8), 'encoder_block_2': (1, 2, 3, 8)}
    """
    check_choice(output, OUTPUTS, "output")
    chosen = _block_indices(indices, encoder.num_blocks(model))
    final_norm = _final_norm(model) if norm else None
    outputs = encoder.block_outputs(model)
    prefix = encoder.num_prefix_tokens(model)
    patch_grid = model.get_layer("patch_embedding").output
    # Keyed by block: Keras unwraps a list of one output, a dict it keeps.
    results = {}
    for i in chosen:
        tokens = final_norm(outputs[i]) if final_norm else outputs[i]
        if output == "grid":
            results[block_name(i)] = PatchTokenGrid(prefix, name=f"grid_{i}")(tokens, patch_grid)
        else:
            results[block_name(i)] = SplitPrefixTokens(prefix, name=f"tokens_{i}")(tokens)
    return keras.Model(model.input, results, name=f"{model.name}_intermediates")


def _block_indices(indices, count):
    """`indices` as block numbers in `[0, count)`, each once; a ValueError naming the bad ones."""
    if indices is None:
        return list(range(count))
    single = isinstance(indices, numbers.Integral) and not isinstance(indices, bool)
    values = [indices] if single else list(indices) if isinstance(indices, (list, tuple, range)) else None
    if values is None or not all(isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in values):
        raise TypeError(f"`indices` must be None, an int or a sequence of ints; received indices={indices!r}")
    bad = [i for i in values if not -count <= i < count]
    if bad or not values:
        raise ValueError(f"`indices` must be block numbers in [{-count}, {count}) for a model of {count} "
                         f"blocks, at least one; received indices={indices!r}")
    return list(dict.fromkeys(int(i) % count for i in values))  # each block once


def _final_norm(model):
    names = {layer.name for layer in model.layers}
    if "encoder_norm" in names:
        return model.get_layer("encoder_norm")
    raise ValueError(
        "norm=True applies the model's final sequence norm 'encoder_norm'; model "
        f"{model.name!r} has none (with fc_norm its final LayerNorm normalises the pooled "
        "vector, not the tokens): pass norm=False"
    )
