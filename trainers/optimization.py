"""Optimisers and learning-rate schedules of the recipes.

Weight decay is decoupled (AdamW-style: w -= lr * wd * w, as Flax's and
Keras' optimisers do) and applies to kernels only: biases, LayerNorm and
GroupNorm parameters, tokens and position tables are excluded, as in the
official code and DeiT.
"""

import math

import keras
from keras import ops

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


@keras.saving.register_keras_serializable(package="keras_vit")
class SGD(ClipsTheSummedGradient, keras.optimizers.SGD):
    """Keras' SGD whose `global_clipnorm` holds across replicas."""


@keras.saving.register_keras_serializable(package="keras_vit")
class Adam(ClipsTheSummedGradient, keras.optimizers.Adam):
    """Keras' Adam, decoupled weight decay included (AdamW when `weight_decay` is set), whose update on
    TensorFlow is TensorFlow's own Adam kernel, one per variable.

    Keras' update builds about 50 graph nodes per variable (the schedule and the step's powers evaluated
    again for each); `ResourceApplyAdam` computes the same formula in one node, and XLA has it too. On a
    ViT that halves the nodes of a training step, and with them much of the first step's tracing and
    graph set-up (BUILD.md). Other backends, AMSGrad and sparse gradients take Keras' own update.
    """

    def _apply_weight_decay(self, variables):
        # Keras' decays every variable before any update; on TensorFlow `update_step` decays each variable
        # just before its update, with the step's learning rate computed once. The same: no variable's
        # update reads another variable.
        if keras.backend.backend() != "tensorflow":
            super()._apply_weight_decay(variables)

    def update_step(self, gradient, variable, learning_rate):
        if keras.backend.backend() != "tensorflow":
            return super().update_step(gradient, variable, learning_rate)
        import tensorflow as tf

        self._decay(variable, learning_rate)
        if self.amsgrad or isinstance(gradient, tf.IndexedSlices):
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        step = tf.cast(self.iterations + 1, dtype)
        beta_1, beta_2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
        index = self._get_variable_index(variable)
        tf.raw_ops.ResourceApplyAdam(
            var=variable.handle, m=self._momentums[index].value.handle, v=self._velocities[index].value.handle,
            beta1_power=tf.pow(beta_1, step), beta2_power=tf.pow(beta_2, step), lr=tf.cast(learning_rate, dtype),
            beta1=beta_1, beta2=beta_2, epsilon=tf.cast(self.epsilon, dtype), grad=tf.cast(gradient, dtype))

    def _decay(self, variable, learning_rate):
        if self.weight_decay is not None and self._use_weight_decay(variable):
            variable.assign_sub(variable * ops.cast(self.weight_decay, variable.dtype)
                                * ops.cast(learning_rate, variable.dtype))


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
        optimizer = SGD(momentum=recipe.momentum, **common)
    else:  # "adam" and "adamw": Keras' Adam decays decoupled when weight_decay is set, as AdamW
        optimizer = Adam(beta_1=recipe.beta_1, beta_2=recipe.beta_2, **common)
    if recipe.weight_decay:
        optimizer.exclude_from_weight_decay(
            var_list=[v for v in model.trainable_variables if not v.name.endswith("kernel")])
    return optimizer
