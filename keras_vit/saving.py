"""`load_model(path)`: a keras_vit model from a `.keras` file or a checkpoint, by one rule.

A `.keras` file of keras_vit carries the model's `ViTConfig` (`vit_config`),
which preprocessing, exports and analyses read. A file without it (saved
before keras_vit models carried their configuration, or from a plain
`keras.Model`) is refused, with the two ways to save it again; it is never
guessed from the layers.
"""

import keras

NO_CONFIG = (
    "{path} holds a Keras model without a ViTConfig (`vit_config`): saved before keras_vit models carried theirs, "
    "or from a plain keras.Model. Save it again with this keras_vit and the ViTConfig it was built from: "
    "old = keras.models.load_model({path!r}); keras_vit.ViTModel(old.input, old.output, vit_config=config)"
    ".save('new.keras') (or build model = keras_vit.ViT(config), call model.set_weights(old.get_weights()) "
    "and model.save('new.keras'))"
)


def load_model(path, *, classifier_activation="softmax", **overrides):
    """The keras_vit model stored at `path`: a `.keras` file, or any checkpoint keras_vit reads.

    Args:
        path: a `.keras` file saved by keras_vit, or a checkpoint (an official
            `.npz`, a timm / Hugging Face `.safetensors` file or directory, a
            pretrained name), built by `keras_vit.ViT.from_checkpoint`.
        classifier_activation: the head's activation of a model built from a
            checkpoint (None: logits). A `.keras` file keeps the head it was
            saved with. Defaults to `"softmax"`.
        **overrides: `keras_vit.ViTConfig` fields that differ from a
            checkpoint's (`image_size=384`: position tables resized). A
            `.keras` file is loaded as it was saved: overrides for it are a
            ValueError.

    Returns:
        A `keras_vit.ViTModel` with its `vit_config`, uncompiled.

    Raises:
        ValueError: for a `.keras` file without a `ViTConfig`, naming how to
            save it again.
    """
    path = str(path)
    if not path.endswith(".keras"):
        from keras_vit.model import ViT

        return ViT.from_checkpoint(path, classifier_activation=classifier_activation, **overrides)
    if overrides:
        raise ValueError(f"A .keras file is loaded as it was saved; received changes {sorted(overrides)} for {path!r}")
    model = keras.models.load_model(path, compile=False)  # inference, export and analysis need no training state
    if getattr(model, "vit_config", None) is None:
        raise ValueError(NO_CONFIG.format(path=path))
    return model
