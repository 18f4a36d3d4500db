"""Loads the model to export: a `.keras` file, or an official `.npz` with its variant.

The `.npz` goes through keras_vit's own checkpoint reader (never a side door),
so a checkpoint written by the trainer is read exactly as users read it.
"""

import pathlib

import keras

import keras_vit
from keras_vit.layers.resnet_stem import output_stride


def load_model(path, variant=None, image_size=None, classes=None, **model_kwargs):
    """Returns the Keras model stored at `path`.

    Args:
        path: a `.keras` file, or an official-format `.npz` (then `variant`
            is required, e.g. "B/16", and `image_size`/`classes` default to the
            checkpoint's grid and head).
        variant: keras_vit variant of an `.npz`.
        image_size: resolution for an `.npz` (position embeddings are resized).
        classes: classes for an `.npz`; default: read from its head.
        **model_kwargs: other `keras_vit.ViT` fields (classifier, channels via input_shape, ...).
    """
    path = str(path)
    if path.endswith(".keras"):
        return keras.models.load_model(path, compile=False)  # no training state needed
    if not path.endswith(".npz"):
        raise ValueError(f"`model` must be a .keras file or an official .npz checkpoint; received {path!r}")
    if not variant:
        raise ValueError(f"An .npz checkpoint needs its variant (e.g. --variant=B/16); received variant={variant!r}")
    arrays = keras_vit.checkpoints.read_npz(path)
    fields = keras_vit.decode_variant(variant)
    kernel = arrays["embedding/kernel"] if "conv_root/kernel" not in arrays else arrays["conv_root/kernel"]
    if classes is None:
        classes = arrays["head/kernel"].shape[-1]
    if image_size is None:
        positions = arrays["Transformer/posembed_input/pos_embedding"].shape[1] - ("cls" in arrays)
        side = int(round(positions ** 0.5))
        stride = fields["patch_size"] * (output_stride(fields["resnet_num_layers"])
                                         if "resnet_num_layers" in fields else 1)
        image_size = side * stride
    model_kwargs.setdefault("classifier", "token" if "cls" in arrays else "gap")
    if "pre_logits/kernel" in arrays:
        model_kwargs.setdefault("representation_size", arrays["pre_logits/kernel"].shape[-1])
    model = keras_vit.ViT(**fields, input_shape=(image_size, image_size, kernel.shape[2]), classes=classes,
                          classifier_activation=None, name=pathlib.Path(path).stem.replace(".", "_"),
                          **model_kwargs)
    return keras_vit.load_npz(model, path)


def outputs_probabilities(model):
    """Whether `model` ends in a softmax (True) or returns logits (False)."""
    activation = getattr(model.layers[-1], "activation", None)
    return activation is keras.activations.softmax
