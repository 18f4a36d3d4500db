"""Two Keras 3.15 faults under MultiWorkerMirroredStrategy, worked around in this one module.

The only place in `trainers` that touches Keras internals. It relies on exactly these, in the installed
Keras; tests/trainers/test_keras_workarounds.py fails when one of them changes:

- `keras.src.backend.tensorflow.trainer.reduce_per_replica(values, strategy, reduction)`, a module
  function that `TensorFlowTrainer` calls by its global name to reduce each step's logs across replicas;
- `TensorFlowTrainer._symbolic_build(iterator=None, data_batch=None)`, which builds the compiled loss and
  metrics from one batch;
- `TensorFlowTrainer._maybe_symbolic_build(iterator=None, data_batch=None)`, which `fit` calls first.

Remove the module when Keras fixes both faults: tests/trainers/test_train.py's two-worker run then passes
without it.
"""

import tensorflow as tf
from keras.src.backend.tensorflow import trainer as keras_trainer


def fit_multi_worker(model, dataset, strategy):
    """Readies a compiled `model` to `fit` under a MultiWorkerMirroredStrategy; `dataset` gives one local batch.

    1. `fit` starts by reducing a distributed batch across workers in eager
       mode only to learn its shapes (`_maybe_symbolic_build`), which fails
       ("Attempt to convert a value (PerReplica...)"). Building the compiled
       loss and metrics here from a local batch leaves it nothing to do.
    2. Its per-step log reduction calls `strategy.reduce("MEAN", v, axis=0)`
       on scalar logs ("Invalid reduction dimension 0"); scalars are reduced
       with `axis=None` instead (process-wide, once, for this strategy class only).
    """
    batch = next(iter(dataset.take(1)))
    with strategy.scope():
        model._symbolic_build(data_batch=batch)
    model._maybe_symbolic_build = lambda iterator=None, data_batch=None: None
    patch_log_reduction()


def patch_log_reduction():
    """Makes Keras reduce scalar logs with `axis=None` under MultiWorkerMirroredStrategy; idempotent."""
    original = keras_trainer.reduce_per_replica
    if getattr(original, "keras_vit_patched", False):
        return

    def reduce_per_replica(values, strategy, reduction):
        if reduction in ("auto", "mean") and isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
            return tf.nest.map_structure(
                lambda v: strategy.reduce("MEAN", v, axis=0 if v.shape.rank else None), values)
        return original(values, strategy, reduction)

    reduce_per_replica.keras_vit_patched = True
    keras_trainer.reduce_per_replica = reduce_per_replica
