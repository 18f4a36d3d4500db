"""The masked-patch-prediction task (`task="mpp"`): its loss, metrics and the models a run writes.

The loss is the cross-entropy of `keras_vit.mpp`'s colour classes over the
corrupted patches only (BERT's rule); top-1 and top-5 count those patches.
The run's `model.keras` is the pre-training network, and its `model.npz` the
plain headless ViT, which any classification recipe fine-tunes with
`--pretrained=MODEL_DIR/model.npz` (the head starts at zero).
"""

import keras

from keras_vit import mpp


def metrics():
    """Top-1 and top-5 of the colour classes, as the classification metrics are named."""
    return [keras.metrics.SparseCategoricalAccuracy(name="top1"),
            keras.metrics.SparseTopKCategoricalAccuracy(k=5, name="top5")]


class MaskedPatchPrediction(keras.Model):
    """Trains an `mpp.mpp_network`: the images are their own targets (the labels are unused)."""

    def __init__(self, network, **kwargs):
        super().__init__(**kwargs)
        self.network = network
        self.patch_loss = keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction="mean_with_sample_weight")

    def call(self, images, training=False):
        outputs = self.network(images, training=training)
        return outputs["logits"], outputs["chosen"], mpp.colour_targets(images, self.network.vit_config)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        logits, chosen, targets = y_pred
        return self.patch_loss(targets, logits, chosen)

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        logits, chosen, targets = y_pred
        return super().compute_metrics(x, targets, logits, chosen)

    @property
    def checkpoint_variables(self):
        return self.network.variables

    def deliverables(self):
        """The models written as model.keras and model.npz: the network and its backbone."""
        return self.network, mpp.backbone(self.network)
