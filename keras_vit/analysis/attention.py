"""Attention maps of every block, and attention rollout (the paper's Figure 6).

`attention_maps` runs one Keras model that calls each block of the model
with `return_attention_scores=True` on the model's own graph; it is built
once per model (cached, weakly, with the model as key) and run as one
compiled `predict_on_batch` call. `attention_rollout` is Abnar & Zuidema,
"Quantifying Attention Flow in Transformers" (ACL 2020), which Dosovitskiy
et al. (2021, Appendix D.8) use to attend from the output token to the
input space; `rollout_map` makes that a per-pixel map of an image.
"""

import numbers
import weakref

import keras
import numpy as np

from keras_vit.analysis import blocks as encoder
from keras_vit.checks import check_choice

HEAD_FUSIONS = ("mean", "max", "min")
# model -> the Keras model of its attention weights; dropped with the model.
_ATTENTION_MODELS = weakref.WeakKeyDictionary()


def attention_model(model):
    """The (cached) Keras model from the model's inputs to every block's attention weights."""
    if model not in _ATTENTION_MODELS:
        scores = [weights for _, weights in encoder.block_outputs(model, return_attention_scores=True)]
        _ATTENTION_MODELS[model] = keras.Model(model.input, scores, name=f"{model.name}_attention")
    return _ATTENTION_MODELS[model]


def attention_maps(model, images):
    """The attention weights of every encoder block of `model` on `images`.

    Works on any keras_vit model as built (token or GAP classifier, prefix
    tokens, rectangular grids, any resolution with `dynamic_image_size`,
    unrolled or scanned encoders).

    Args:
        model: a keras_vit ViT.
        images: `(batch, height, width, channels)` array, preprocessed as
            the model expects (`keras_vit.preprocess_input`).

    Returns:
        A list with one float32 numpy array per block, `(batch, heads,
        tokens, tokens)`; rows are queries and sum to 1. Tokens are the
        prefix tokens, then the patches row by row.

    Example:
    >>> vit = keras_vit.ViT(patch_size=4, hidden_size=8, mlp_dim=16, num_heads=2, num_layers=3, image_size=(8, 12))
    >>> maps = attention_maps(vit, np.zeros((1, 8, 12, 3)))
    >>> len(maps), maps[0].shape
    (3, (1, 2, 7, 7))
    """
    images = check_images(model, images)
    maps = attention_model(model).predict_on_batch(images)
    maps = maps if isinstance(maps, list) else [maps]  # Keras gives one block's array bare
    return [np.asarray(m, np.float32) for m in maps]


def check_images(model, images):
    """`images` as a float32 array the model accepts; a ValueError naming the expected shape otherwise."""
    encoder.check_model(model)
    images = np.asarray(images, np.float32)
    expected = tuple(model.input_shape[1:])
    fits = images.ndim == 4 and all(e is None or e == r for e, r in zip(expected, images.shape[1:], strict=True))
    token = token_size(model)
    if not fits or images.shape[1] % token[0] or images.shape[2] % token[1]:
        raise ValueError(f"`images` must be (batch, {', '.join(map(str, expected))}) with height and width "
                         f"divisible by {token}; received images of shape {images.shape}")
    return images


def token_size(model):
    """Pixels per token: the patch, times the ResNet stem's stride in a hybrid."""
    config = getattr(model, "vit_config", None)
    return config.token_size if config is not None else model.get_layer("patch_embedding").patch_size


def attention_rollout(maps, head_fusion="mean", discard_ratio=0.0):
    """Attention rollout: how much each token attends to each input token through all blocks.

    Per block, the heads are fused, the identity is added for the residual
    connection and rows are renormalised: `A = (W + I) / rowsum`; the blocks'
    matrices are then multiplied, last block on the left (Abnar & Zuidema,
    2020, Eq. 1).

    Args:
        maps: a list of `(batch, heads, tokens, tokens)` arrays, one per
            block in order (`attention_maps`).
        head_fusion: `"mean"` (the paper's), `"max"` or `"min"` over heads.
            Defaults to `"mean"`.
        discard_ratio: float in [0, 1). Per block and image, the smallest
            fraction of fused weights set to zero before the identity is
            added (a denoising of jacobgil/vit-explain; 0 is the paper's).
            Defaults to 0.

    Returns:
        `(batch, tokens, tokens)` float64 array; each row sums to 1.

    Example:
    >>> maps = [np.full((1, 2, 3, 3), 1 / 3)] * 2
    >>> attention_rollout(maps)[0].round(3)
    array([[0.5 , 0.25, 0.25],
           [0.25, 0.5 , 0.25],
           [0.25, 0.25, 0.5 ]])
    """
    check_choice(head_fusion, HEAD_FUSIONS, "head_fusion")
    if isinstance(discard_ratio, bool) or not (isinstance(discard_ratio, numbers.Real) and 0.0 <= discard_ratio < 1.0):
        raise ValueError(f"`discard_ratio` must be a float in [0, 1); received discard_ratio={discard_ratio!r}")
    maps = check_maps(maps)
    fuse = {"mean": np.mean, "max": np.max, "min": np.min}[head_fusion]
    tokens = maps[0].shape[-1]
    rollout = np.broadcast_to(np.eye(tokens), (maps[0].shape[0], tokens, tokens))
    for weights in maps:
        fused = _discard_smallest(fuse(weights, axis=1), discard_ratio)
        step = fused + np.eye(tokens)
        rollout = (step / step.sum(axis=-1, keepdims=True)) @ rollout
    return rollout


def _discard_smallest(fused, ratio):
    """`fused` (batch, tokens, tokens) with its smallest `ratio` of entries per image set to 0."""
    count = int(ratio * fused.shape[1] * fused.shape[2])
    if not count:
        return fused
    flat = fused.reshape(len(fused), -1).copy()
    smallest = np.argpartition(flat, count - 1, axis=-1)[:, :count]
    np.put_along_axis(flat, smallest, 0.0, axis=-1)
    return flat.reshape(fused.shape)


def check_maps(maps):
    """`maps` as a list of float64 `(batch, heads, tokens, tokens)` arrays of one shape; a ValueError otherwise."""
    if isinstance(maps, np.ndarray) and maps.ndim == 5:
        maps = list(maps)
    if not isinstance(maps, (list, tuple)) or not maps:
        raise ValueError("`maps` must be a non-empty list of (batch, heads, tokens, tokens) arrays, one per "
                         f"block; received {type(maps).__name__}")
    maps = [np.asarray(m, np.float64) for m in maps]
    shapes = {m.shape for m in maps}
    shape = maps[0].shape
    if len(shapes) > 1 or len(shape) != 4 or shape[2] != shape[3]:
        raise ValueError("`maps` must hold (batch, heads, tokens, tokens) arrays of one shape; "
                         f"received shapes {sorted(shapes)}")
    return maps


def rollout_map(model, images, head_fusion="mean", discard_ratio=0.0):
    """Per-pixel attention rollout of the model's output on each image, in [0, 1].

    A class-token model: the class token's rollout row over the patch
    tokens; a distilled DeiT, whose output averages its class and
    distillation tokens' heads: the mean of those two rows. A MAP model
    (`classifier="map"`): the patch tokens' rows weighted by the probe's
    attention over them (the mean of its heads). A model pooling the patches
    (GAP): the mean of every patch token's row. DINOv2's classifier, which
    reads both (`classifier="token_and_gap"`): the mean of the two. Register
    tokens are left out as the class token is. The patch grid is upsampled bilinearly to the
    image size.

    Args:
        model: a keras_vit ViT.
        images: `(batch, height, width, channels)`, preprocessed.
        head_fusion, discard_ratio: as in `attention_rollout`.

    Returns:
        `(batch, height, width)` float32 array, scaled to [0, 1] per image
        (all zeros where the map is flat).

    Example:
    >>> vit = keras_vit.ViT(patch_size=4, hidden_size=8, mlp_dim=16, num_heads=2, num_layers=2, image_size=(8, 12))
    >>> rollout_map(vit, np.random.default_rng(0).uniform(-1, 1, (1, 8, 12, 3))).shape
    (1, 8, 12)
    """
    images = check_images(model, images)
    rollout = attention_rollout(attention_maps(model, images), head_fusion, discard_ratio)
    prefix = encoder.num_prefix_tokens(model)
    if _pooling_mode(model) == "token_and_gap":
        weights = (rollout[:, 0, prefix:] + rollout[:, prefix:, prefix:].mean(axis=1)) / 2
    elif _pools_class_token(model):
        read = 2 if "distillation_pooling" in {layer.name for layer in model.layers} else 1  # the tokens' heads
        weights = rollout[:, :read, prefix:].mean(axis=1)
    elif "map_head" in {layer.name for layer in model.layers}:
        weights = np.einsum("bp,bpq->bq", _probe_attention(model, images), rollout[:, prefix:, prefix:])
    else:
        weights = rollout[:, prefix:, prefix:].mean(axis=1)
    height, width = images.shape[1:3]
    rows, cols = (size // token for size, token in zip((height, width), token_size(model), strict=True))
    grid = weights.reshape(-1, rows, cols, 1).astype(np.float32)
    upsampled = keras.ops.convert_to_numpy(keras.ops.image.resize(grid, (height, width), interpolation="bilinear"))
    return _scale_each(upsampled[..., 0])


def _probe_attention(model, images):
    """`(batch, patches)`: a MAP head's attention over the patch tokens, its heads averaged."""
    head = model.get_layer("map_head")
    tokens = keras.Model(model.input, head.input)(images)
    _, scores = head(tokens, return_attention_scores=True)
    return keras.ops.convert_to_numpy(scores)[:, :, 0].mean(axis=1)


def _pooling_mode(model):
    """The model's pooling layer's mode, else its configuration's classifier."""
    names = {layer.name for layer in model.layers}
    return model.get_layer("pooling").mode if "pooling" in names else model.vit_config.classifier


def _pools_class_token(model):
    """Whether the model's output is read from the class token alone."""
    return _pooling_mode(model) == "token"


def _scale_each(maps):
    low = maps.min(axis=(1, 2), keepdims=True)
    span = maps.max(axis=(1, 2), keepdims=True) - low
    return np.where(span > 0, (maps - low) / np.where(span > 0, span, 1), 0.0).astype(np.float32)
