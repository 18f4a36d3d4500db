"""Keras' Adam and AdamW whose update on TensorFlow is TensorFlow's own Adam kernel, one node per variable.

Keras' update builds about forty graph nodes per variable, the step's bias-correction powers and the casts of
the learning rate and betas evaluated again for each; `ResourceApplyAdam` computes the same formula
(m += (g - m)(1 - b1), v += (g^2 - v)(1 - b2), w -= lr sqrt(1 - b2^t) / (1 - b1^t) m / (sqrt(v) + eps)) in one
node, and XLA has it too; decoupled weight decay (w -= lr wd w) is one `ResourceApplyGradientDescent`. The
scalars a step shares are computed once per step and device, not once per variable. On a ViT that
shortens the first training step's tracing and graph set-up by seconds (BUILD.md). Other backends, AMSGrad
and sparse gradients take Keras' own update. `keras_vit.ViTModel.compile` picks these on TensorFlow (`fused`).
"""

import keras


class FusedAdamUpdate:
    """Mixin over Keras' Adam: on TensorFlow, each variable's decay and update reuse the step's shared scalars
    and end in one `ResourceApplyAdam`."""

    def _apply_weight_decay(self, variables):
        # Keras decays every variable before any update; on TensorFlow `update_step` decays each variable just
        # before its own update. The same: no variable's update reads another variable.
        if keras.backend.backend() != "tensorflow":
            super()._apply_weight_decay(variables)

    def _distributed_tf_update_step(self, distribution, grads_and_vars, learning_rate):
        # Keras' TensorFlow optimizer updates every variable inside this one call per step (in cross-replica
        # context under tf.distribute), so the shared scalars live for exactly this call.
        self._step_scalars = {}
        try:
            return super()._distributed_tf_update_step(distribution, grads_and_vars, learning_rate)
        finally:
            del self._step_scalars

    def update_step(self, gradient, variable, learning_rate):
        if keras.backend.backend() != "tensorflow":
            return super().update_step(gradient, variable, learning_rate)
        import tensorflow as tf

        if len(getattr(learning_rate, "shape", ())):  # a rate per block of a stacked weight (layer decay)
            # ResourceApplyAdam takes one rate; Keras' update broadcasts.
            if self.weight_decay is not None and self._use_weight_decay(variable):
                variable.assign_sub(variable * tf.cast(self.weight_decay * learning_rate, variable.dtype))
            return super().update_step(gradient, variable, learning_rate)
        scalars = self._shared_scalars(variable, learning_rate)
        if self.weight_decay is not None and self._use_weight_decay(variable):
            # w -= (lr wd) w: Keras' w -= (w wd) lr up to rounding, in one kernel with the product made once.
            tf.raw_ops.ResourceApplyGradientDescent(var=variable.handle, alpha=scalars["decay"], delta=variable)
        if self.amsgrad or isinstance(gradient, tf.IndexedSlices):
            return super().update_step(gradient, variable, learning_rate)
        index = self._get_variable_index(variable)
        tf.raw_ops.ResourceApplyAdam(
            var=variable.handle, m=self._momentums[index].value.handle, v=self._velocities[index].value.handle,
            beta1_power=scalars["beta1_power"], beta2_power=scalars["beta2_power"], lr=scalars["lr"],
            beta1=scalars["beta_1"], beta2=scalars["beta_2"], epsilon=scalars["epsilon"],
            grad=tf.cast(gradient, variable.dtype))

    def _shared_scalars(self, variable, learning_rate):
        """The step's scalars in `variable`'s dtype, made once per graph, device and dtype within a step."""
        import tensorflow as tf

        dtype = variable.dtype
        # The graph: a step under gradient accumulation runs in a cond branch; the device: each replica's
        # update runs on its own (MirroredStrategy), with its own learning rate and step.
        key = (id(tf.compat.v1.get_default_graph()), variable.device, dtype)
        cache = getattr(self, "_step_scalars", None)
        if cache is not None and key in cache:
            return cache[key]
        step = tf.cast(self.iterations + 1, dtype)
        beta_1, beta_2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
        scalars = {"lr": tf.cast(learning_rate, dtype), "beta_1": beta_1, "beta_2": beta_2,
                   "beta1_power": tf.pow(beta_1, step), "beta2_power": tf.pow(beta_2, step),
                   "epsilon": tf.cast(self.epsilon, dtype)}
        if self.weight_decay is not None:
            scalars["decay"] = scalars["lr"] * tf.cast(self.weight_decay, dtype)
        if cache is not None:
            cache[key] = scalars
        return scalars


@keras.saving.register_keras_serializable(package="keras_vit")
class Adam(FusedAdamUpdate, keras.optimizers.Adam):
    """`keras.optimizers.Adam` (decoupled weight decay when `weight_decay` is set), the same arguments and
    config, whose update on TensorFlow is `ResourceApplyAdam`, one node per variable."""


@keras.saving.register_keras_serializable(package="keras_vit")
class AdamW(FusedAdamUpdate, keras.optimizers.AdamW):
    """`keras.optimizers.AdamW`, the same arguments and config, whose update on TensorFlow is
    `ResourceApplyAdam`, one node per variable."""


# Keras' own class for each class here: what `keras_vit.ViTModel.compile` replaces.
FUSED = {keras.optimizers.Adam: Adam, keras.optimizers.AdamW: AdamW}


def fused(optimizer):
    """`optimizer` with the fused update where there is one: a Keras name ("adam", "adamw") resolved by Keras and
    made the fused class with Keras' defaults; an instance of exactly Keras' Adam or AdamW given the fused class in
    place (the same object, config and state: the subclass adds no field); anything else as it came."""
    if isinstance(optimizer, str):
        resolved = keras.optimizers.get(optimizer)  # Keras' own names, case rules and errors
        return FUSED[type(resolved)].from_config(resolved.get_config()) if type(resolved) in FUSED else resolved
    if type(optimizer) in FUSED:
        # Keras' optimizers track what is set on them; the class is no attribute to track.
        object.__setattr__(optimizer, "__class__", FUSED[type(optimizer)])
    return optimizer
