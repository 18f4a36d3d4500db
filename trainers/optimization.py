"""Optimisers and learning-rate schedules of the recipes.

Weight decay is decoupled (AdamW-style: w -= lr * wd * w, as Flax's and
Keras' optimisers do) and applies to kernels only: biases, LayerNorm and
GroupNorm parameters, tokens and position tables are excluded, as in the
official code and DeiT.
"""

import contextlib
import math

import keras
from keras import ops

from keras_vit import optimizers
from keras_vit.fine_tuning import fine_tuning_optimizer
from trainers.recipes import DECAYS


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
        if decay not in DECAYS:  # any other name would run as a constant learning rate
            raise ValueError(f"`decay` must be one of {DECAYS}; received decay={decay!r}")
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


class ClipsTheSummedGradient:
    """Mixin: `global_clipnorm` bounds the gradient summed over the replicas, as on one device.

    Keras clips in `apply`, before it sums the replicas' gradients, so each
    replica's share was clipped alone and the sum could reach replicas x the
    norm. Here the shares are summed first, the sum clipped, and each replica
    hands on 1/replicas of it to Keras' own sum.
    """

    def _clip_gradients(self, grads):
        if keras.backend.backend() == "tensorflow" and self.global_clipnorm:
            import tensorflow as tf

            context = tf.distribute.get_replica_context()
            if context is not None and context.num_replicas_in_sync > 1:
                summed = context.all_reduce(tf.distribute.ReduceOp.SUM, grads)
                clipped, _ = tf.clip_by_global_norm(summed, self.global_clipnorm)
                return [g / context.num_replicas_in_sync for g in clipped]
        return super()._clip_gradients(grads)


class LendsGradients:
    """Mixin: inside `lending_gradients()`, `apply` hands its gradients over instead of applying them.

    `trainers.accumulation` runs the model's own training step on each micro-batch and sums what it lends.
    """

    @contextlib.contextmanager
    def lending_gradients(self):
        """Yields `{id(variable): gradient}`, filled by the `apply` calls made inside the block."""
        lent = {}
        object.__setattr__(self, "_lent", lent)  # past Keras' attribute tracking: a plain dict for one trace
        try:
            yield lent
        finally:
            object.__setattr__(self, "_lent", None)

    def apply(self, grads, trainable_variables=None):
        lent = getattr(self, "_lent", None)
        if lent is None:
            return super().apply(grads, trainable_variables)
        # Keras' stateless_apply (JAX) names no variables: the optimiser's own, in its order.
        variables = self._trainable_variables if trainable_variables is None else trainable_variables
        lent.update(zip(map(id, variables), grads, strict=True))
        return None


@keras.saving.register_keras_serializable(package="keras_vit")
class SGD(LendsGradients, ClipsTheSummedGradient, keras.optimizers.SGD):
    """Keras' SGD whose `global_clipnorm` holds across replicas, which lends its gradients for accumulation."""


# Registered under "trainers": "keras_vit>Adam" names keras_vit's own fused Adam, which this one extends.
@keras.saving.register_keras_serializable(package="trainers")
class Adam(LendsGradients, ClipsTheSummedGradient, optimizers.Adam):
    """keras_vit's Adam (Keras' Adam whose update on TensorFlow is TensorFlow's own Adam kernel, one node per
    variable; decoupled weight decay when `weight_decay` is set, as AdamW), whose `global_clipnorm` holds across
    replicas, which lends its gradients for accumulation."""


def peak_learning_rate(recipe):
    """The recipe's learning rate, scaled by batch / reference when it names one."""
    if recipe.lr_batch_reference:
        return recipe.learning_rate * recipe.batch_size / recipe.lr_batch_reference
    return recipe.learning_rate


def make_optimizer(recipe, model):
    """The recipe's optimiser, with weight decay on `model`'s kernels only, and its fine-tuning options: layer
    decay over `model`'s blocks and a weight EMA (left out of the model at the end of each `fit`: the loop trains
    in chunks and lends the average for evaluations and files)."""
    schedule = WarmupSchedule(peak_learning_rate(recipe), recipe.warmup_steps, recipe.train_steps, recipe.schedule)
    common = dict(learning_rate=schedule, weight_decay=recipe.weight_decay or None,
                  global_clipnorm=recipe.grad_clip_norm or None)
    if recipe.optimizer == "sgd":
        optimizer = SGD(momentum=recipe.momentum, **common)
    else:  # "adam" and "adamw": Keras' Adam decays decoupled when weight_decay is set, as AdamW
        optimizer = Adam(beta_1=recipe.beta_1, beta_2=recipe.beta_2, **common)
    if recipe.layer_decay < 1 or recipe.ema_decay:
        optimizer = fine_tuning_optimizer(optimizer, model, layer_decay=recipe.layer_decay if recipe.layer_decay < 1
                                          else None, ema_decay=recipe.ema_decay or None,
                                          ema_warmup=recipe.ema_warmup, ema_finalize=False)
    if recipe.weight_decay:
        optimizer.exclude_from_weight_decay(
            var_list=[v for v in model.trainable_variables if not v.name.endswith("kernel")])
    return optimizer
