"""Gradient accumulation inside the training step, as big_vision's and vit_jax's `accum_steps`.

`accumulate_gradients(model, K)` makes each training step split its batch (each replica's share) into K
micro-batches, run the model's own step on each in a `tf.while_loop` (one micro-batch's activations alive at a
time), sum the gradients its optimiser lends instead of applying them, and apply their mean once: the update of the
whole batch, one optimiser step, the schedule and checkpoints counted in steps as without accumulation.

On JAX the same: the model's own stateless step runs on each micro-batch in a `jax.lax.scan`, its optimiser
lending the gradients, and `stateless_apply` applies their mean once.

Keras' own `gradient_accumulation_steps` updates inside a `cond` on its count of micro-batches; under a
tf.distribute strategy that `cond` holds the all-reduce, which TensorFlow refuses ("merge_call called while
defining a new graph"). Here the loop holds no all-reduce: the one update after it reduces as any step does.
"""

import keras
import tensorflow as tf


def accumulate_gradients(model, steps):
    """Makes `model`'s training step accumulate `steps` micro-batches per optimiser update (1: as it is).

    The model's optimiser must lend its gradients (`trainers.optimization.LendsGradients`); each replica's batch
    must divide by `steps` (the recipe's checks).
    """
    if steps == 1:
        return
    if keras.backend.backend() == "jax":
        _accumulate_on_jax(model, steps)
        return
    one_step = model.train_step

    def train_step(data):
        micro = tf.nest.map_structure(lambda t: tf.reshape(t, tf.concat([[steps, -1], tf.shape(t)[1:]], 0)), data)
        variables = model.trainable_variables

        def accumulate(i, sums):
            with model.optimizer.lending_gradients() as lent:
                one_step(tf.nest.map_structure(lambda t: t[i], micro))
            grads = [lent.get(id(variable)) for variable in variables]
            return i + 1, [s if g is None else s + tf.cast(g, s.dtype) for s, g in zip(sums, grads, strict=True)]

        # One micro-batch at a time: its activations die before the next one's forward pass.
        _, sums = tf.while_loop(lambda i, _: i < steps, accumulate,
                                (tf.constant(0), [tf.zeros_like(v) for v in variables]), parallel_iterations=1)
        model.optimizer.apply([s / steps for s in sums], variables)
        return model.get_metrics_result()

    model.train_step = train_step


def _accumulate_on_jax(model, steps):
    """`accumulate_gradients` for Keras' JAX trainer, whose step is `train_step(state, data) -> (logs, state)`."""
    import jax
    import jax.numpy as jnp

    one_step = model.train_step
    variables = model.trainable_variables

    def train_step(state, data):
        micro = jax.tree_util.tree_map(lambda t: jnp.reshape(t, (steps, -1, *t.shape[1:])), data)

        def accumulate(carry, batch):
            state, sums = carry
            with model.optimizer.lending_gradients() as lent:
                logs, state = one_step(state, batch)
            grads = [lent.get(id(variable)) for variable in variables]
            sums = [s if g is None else s + g.astype(s.dtype) for s, g in zip(sums, grads, strict=True)]
            return (state, sums), logs

        # One micro-batch at a time, as on TensorFlow: the scan's body holds one micro-batch's activations.
        zeros = [jnp.zeros(v.shape, v.dtype) for v in state[0]]
        (state, sums), logs = jax.lax.scan(accumulate, (state, zeros), micro)
        trainable, non_trainable, optimizer_variables, metrics_variables = state
        trainable, optimizer_variables = model.optimizer.stateless_apply(
            optimizer_variables, [s / steps for s in sums], trainable)
        # The metrics' state holds every micro-batch: the last micro-batch's logs are the step's.
        return jax.tree_util.tree_map(lambda t: t[-1], logs), (trainable, non_trainable, optimizer_variables,
                                                              metrics_variables)

    model.train_step = train_step
