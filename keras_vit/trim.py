"""The last encoder block cut to the tokens the head reads: the same outputs for less work.

A head that reads the class token (and DeiT's distillation token) takes
nothing else from the last block, so that block need only ask with those
tokens: the other tokens still serve as its keys and values, but their
queries, attention rows, residuals and MLP are never used. Cutting them
saves about a twelfth of a 12-block model's inference, and every output is
what the untrimmed model gives (the same operations on fewer rows). The
SavedModel and OpenVINO exports serve a trimmed copy (`export/`); the model
itself keeps every token, so `encoder_norm`'s output and the analysis tools
still see the whole sequence.
"""

import keras
import numpy as np

from keras_vit.layers import EncoderBlock
from keras_vit.layers.norms import NORM_CLASSES
from keras_vit.layers.pooling import SequencePooling

# SequencePooling modes that read one prefix token, and the tokens the last block must then keep.
_TOKENS_READ = {"token": 1, "distillation": 2}


def head_tokens(model):
    """How many leading tokens a model's outputs read from its last encoder block; None when more or unknown.

    1 for a class-token head, 2 for DeiT's two; None for average, max or MAP
    pooling, a model that returns the sequence, a scanned encoder, relative
    positions (logits made for every token asking) or a model not built by
    keras_vit.
    """
    last = _last_block(model)
    if last is None or last.relative_position or last.output_tokens is not None:
        return None
    readers = _consumers(model, last)
    if len(readers) == 1 and isinstance(readers[0], NORM_CLASSES):  # encoder_norm, per token
        readers = _consumers(model, readers[0])
    if not readers or not all(isinstance(layer, SequencePooling) and layer.mode in _TOKENS_READ for layer in readers):
        return None
    return max(_TOKENS_READ[layer.mode] for layer in readers)


def trim_last_block(model, check=True):
    """A copy of `model` whose last encoder block computes only the tokens the head reads.

    Returns `model` itself when `head_tokens(model)` is None, and for blocks
    computing in half precision, whose rounding on fewer rows would move the
    scores by more than the exporters' 1e-5 check of the served model against
    Keras. The copy has its own layers and a copy of the weights: a serving
    snapshot, which training the original afterwards does not change.

    Args:
        model: a functional Keras model built by keras_vit.
        check: run both on two seeded images and raise RuntimeError unless
            their outputs agree within 1e-5 of the outputs' scale. Defaults
            to True.

    Example:
    >>> model = keras_vit.ViT(patch_size=4, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2,
    ...                       image_size=16, classes=10)
    >>> trim_last_block(model).get_layer("encoder_block_1").output.shape
    (None, 1, 32)
    """
    tokens = head_tokens(model)
    last = _last_block(model)
    if tokens is None or last.compute_dtype != "float32":
        return model

    def clone(layer):
        config = layer.get_config()
        if layer is last:
            config["output_tokens"] = tokens
        return layer.__class__.from_config(config)

    copy = keras.models.clone_model(model, clone_function=clone)
    copy.set_weights(model.get_weights())
    if hasattr(model, "vit_config"):
        copy.vit_config = model.vit_config
    if check:
        _check_same_outputs(model, copy)
    return copy


def _check_same_outputs(model, copy, tolerance=1e-5):
    shape = model.input_shape[1:]
    if None in shape:  # a model of dynamic_image_size: its configured size
        shape = (*model.vit_config.image_size, shape[-1])
    images = np.random.default_rng(0).uniform(-1, 1, (2, *shape)).astype("float32")
    expected, received = (keras.tree.flatten(keras.tree.map_structure(
        keras.ops.convert_to_numpy, m(images, training=False))) for m in (model, copy))
    for want, got in zip(expected, received, strict=True):
        difference = float(np.max(np.abs(want.astype("float64") - got)))
        if not difference <= tolerance * max(1.0, float(np.max(np.abs(want)))):
            raise RuntimeError(f"the trimmed copy of {model.name!r} differs from it by {difference:.3g} "
                               f"(at most {tolerance:g} of the outputs' scale expected): please report this model")


def _last_block(model):
    """The model's last `EncoderBlock` layer; None without one (a scanned encoder, a foreign model)."""
    return next((layer for layer in reversed(model.layers) if isinstance(layer, EncoderBlock)), None)


def _consumers(model, layer):
    """The layers of `model` that take `layer`'s output (each called once, as the builders call them); the model's
    own outputs count as a reader None."""
    output = layer.output
    readers = [other for other in model.layers if any(t is output for t in keras.tree.flatten(other.input))]
    if any(t is output for t in keras.tree.flatten(model.outputs)):
        readers.append(None)
    return readers
