"""A short demonstration: build a small ViT, run it, save and reload it.

`python -m keras_vit.demo` is the README's main command until the trainer
exists: it shows the builders, the model summary, a forward pass on a real
(synthetic-free) image grid, and the `.keras` round trip.
"""

import os
import sys
import tempfile

import keras
import numpy as np

import keras_vit


def main():
    model = keras_vit.ViT_Ti16(classes=10, image_size=(64, 96), classifier_activation=None)
    model.summary(print_fn=print, line_length=100)
    print(f"ViT-Ti/16 at 64x96: {model.count_params():,} parameters")
    # A smooth, deterministic image: a horizontal and a vertical ramp.
    rows, cols = np.meshgrid(np.linspace(0, 255, 64), np.linspace(0, 255, 96), indexing="ij")
    image = np.stack([rows, cols, 255 - rows], axis=-1).astype("uint8")[None]
    logits = np.asarray(model(keras_vit.preprocess_input(image)))
    print("logits of a fresh model (the head starts at zero):", logits.round(4).tolist())
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "vit_ti16.keras")
        model.save(path)
        reloaded = keras.models.load_model(path)
        same = np.array_equal(np.asarray(reloaded(keras_vit.preprocess_input(image))), logits)
        print(f"saved to {os.path.basename(path)} and reloaded: outputs identical = {same}")
    for name in ("ViT_B16", "ViT_L16", "ViT_H14"):
        size = getattr(keras_vit, name)(weights=None).count_params()
        print(f"{name} at 224 px, 1000 classes: {size:,} parameters")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
