"""Loads the model to export: a `.keras` file, or any checkpoint keras_vit reads.

A checkpoint (official `.npz`, timm / Hugging Face `.safetensors` or model
directory) goes through `keras_vit.ViT.from_checkpoint`, which reads the
architecture off the file itself (never a side door), so a checkpoint is
read exactly as users read it.
"""

import keras

import keras_vit


def load_model(path, **overrides):
    """Returns the Keras model stored at `path`, logits out for a checkpoint.

    Args:
        path: a `.keras` file or a checkpoint.
        **overrides: `keras_vit.ViTConfig` fields that differ from a
            checkpoint's (e.g. `image_size=384`: position tables resized).
    """
    path = str(path)
    if path.endswith(".keras"):
        if overrides:
            raise ValueError(f"A .keras file is exported as it is; received changes {sorted(overrides)} for {path!r}")
        return keras.models.load_model(path, compile=False)  # no training state needed
    return keras_vit.ViT.from_checkpoint(path, classifier_activation=None, **overrides)
