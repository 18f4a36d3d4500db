"""Optimisers and learning-rate schedules of the recipes.

Weight decay is decoupled (AdamW-style: w -= lr * wd * w, as Flax's and
Keras' optimisers do) and applies to kernels only: biases, LayerNorm and
GroupNorm parameters, tokens and position tables are excluded, as in the
official code and DeiT.
"""

import math

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_vit")
class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up from 0 to `peak`, then cosine or linear decay to 0, or constant.

    Args:
        peak: float. Learning rate at the end of the warm-up.
        warmup_steps: int. Steps of linear warm-up.
        total_steps: int. Step at which decay reaches 0.
        decay: "cosine", "linear" or "constant".
    """

    def __init__(self, peak, warmup_steps, total_steps, decay="cosine"):
        self.peak = float(peak)
        self.warmup_steps = int(warmup_steps)
        self.total_steps = int(total_steps)
        self.decay = decay

    def __call__(self, step):
        step = ops.cast(step, "float32")
        warmup = self.peak * step / max(self.warmup_steps, 1)
        progress = ops.clip((step - self.warmup_steps) / max(self.total_steps - self.warmup_steps, 1), 0.0, 1.0)
        if self.decay == "cosine":
            after = self.peak * 0.5 * (1.0 + ops.cos(math.pi * progress))
        elif self.decay == "linear":
            after = self.peak * (1.0 - progress)
        else:
            after = ops.full_like(progress, self.peak)
        return ops.where(step < self.warmup_steps, warmup, after)

    def get_config(self):
        return {"peak": self.peak, "warmup_steps": self.warmup_steps,
                "total_steps": self.total_steps, "decay": self.decay}


def peak_learning_rate(recipe):
    """The recipe's learning rate, scaled by batch / reference when it names one."""
    if recipe.lr_batch_reference:
        return recipe.learning_rate * recipe.batch_size / recipe.lr_batch_reference
    return recipe.learning_rate


def make_optimizer(recipe, model):
    """The recipe's optimiser, with weight decay on `model`'s kernels only."""
    schedule = WarmupSchedule(peak_learning_rate(recipe), recipe.warmup_steps, recipe.train_steps, recipe.schedule)
    common = dict(learning_rate=schedule, weight_decay=recipe.weight_decay or None,
                  global_clipnorm=recipe.grad_clip_norm or None)
    if recipe.optimizer == "sgd":
        optimizer = keras.optimizers.SGD(momentum=recipe.momentum, **common)
    else:  # Keras' Adam decays decoupled too when weight_decay is set, as AdamW
        # AdamW without decay is Adam (and Keras' AdamW refuses weight_decay=None).
        adam = keras.optimizers.AdamW if recipe.optimizer == "adamw" and recipe.weight_decay else keras.optimizers.Adam
        optimizer = adam(beta_1=recipe.beta_1, beta_2=recipe.beta_2, **common)
    if recipe.weight_decay:
        optimizer.exclude_from_weight_decay(
            var_list=[v for v in model.trainable_variables if not v.name.endswith("kernel")])
    return optimizer
