"""The embedded default dataset: scikit-learn's handwritten digits as TFDS.

1,797 8x8 grayscale digits of the UCI "Optical Recognition of Handwritten
Digits" collection, as scikit-learn ships them (no download). Exposed as a
TFDS builder so it travels the same `tfds.builder(...).download_and_prepare()`
/ `as_dataset` path as `cifar10` or `imagenet2012`.

The split is fixed: every fifth example (index % 5 == 0) is `test` (360
images), the rest `train` (1,437). Pixels are scaled from scikit-learn's 0-16
to 0-255 uint8, the range of every other TFDS image dataset.
"""

import numpy as np
import tensorflow_datasets as tfds

NAME = "keras_vit_digits"


class KerasVitDigits(tfds.core.GeneratorBasedBuilder):
    """scikit-learn's 8x8 digits, train 1,437 / test 360."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Fixed split: index % 5 == 0 is test."}

    def _info(self):
        return self.dataset_info_from_configs(
            features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(shape=(8, 8, 1), dtype=np.uint8),
                "label": tfds.features.ClassLabel(num_classes=10),
            }),
            supervised_keys=("image", "label"),
            homepage="https://archive.ics.uci.edu/dataset/80",
            citation="Alpaydin & Kaynak (1998), Optical Recognition of Handwritten Digits, UCI.",
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # the data ships with scikit-learn
        from sklearn.datasets import load_digits

        digits = load_digits()
        images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)[..., None]
        test = np.arange(len(images)) % 5 == 0
        return {
            "train": self._generate_examples(images[~test], digits.target[~test]),
            "test": self._generate_examples(images[test], digits.target[test]),
        }

    def _generate_examples(self, images, labels):
        for i, (image, label) in enumerate(zip(images, labels, strict=True)):
            yield i, {"image": image, "label": int(label)}


def write_pngs(folder, split="test", data_dir=None):
    """Writes a split's images as `folder/NNNN_LABEL.png` (real files for `python -m export --images`); their paths."""
    import os

    import tensorflow as tf

    os.makedirs(folder, exist_ok=True)
    paths = []
    for k, (image, label) in enumerate(tfds.load(NAME, split=split, data_dir=data_dir, as_supervised=True)):
        paths.append(os.path.join(folder, f"{k:04d}_{int(label)}.png"))
        tf.io.write_file(paths[-1], tf.io.encode_png(image))
    return paths

