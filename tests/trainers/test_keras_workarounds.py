"""The Keras internals trainers/keras_workarounds.py relies on are still there, shaped as it assumes.

When one of these fails, Keras has changed: check whether the faults the module works around are gone (remove
it) or adapt it to the new internals.
"""

import inspect

import tensorflow as tf
from keras.src.backend.tensorflow import trainer as keras_trainer

from trainers import keras_workarounds


def parameters(function):
    return list(inspect.signature(function).parameters)


def test_the_log_reduction_is_a_module_function_the_trainer_calls_by_name():
    assert parameters(keras_trainer.reduce_per_replica) == ["values", "strategy", "reduction"]
    # Looked up as a global at each call, so replacing the module attribute reaches the running trainer.
    source = inspect.getsource(keras_trainer.TensorFlowTrainer)
    assert "reduce_per_replica(" in source and "keras_trainer" not in source


def test_fit_starts_with_the_symbolic_build_the_workaround_builds_ahead():
    trainer = keras_trainer.TensorFlowTrainer
    assert parameters(trainer._symbolic_build) == ["self", "iterator", "data_batch"]
    assert parameters(trainer._maybe_symbolic_build) == ["self", "iterator", "data_batch"]
    assert "self._maybe_symbolic_build(" in inspect.getsource(trainer.fit)


def test_the_patched_reduction_changes_multi_worker_scalars_only(monkeypatch):
    calls = []

    def original(values, strategy, reduction):
        calls.append(reduction)
        return values

    monkeypatch.setattr(keras_trainer, "reduce_per_replica", original)
    keras_workarounds.patch_log_reduction()
    patched = keras_trainer.reduce_per_replica
    assert patched is not original and patched.keras_vit_patched
    keras_workarounds.patch_log_reduction()  # idempotent
    assert keras_trainer.reduce_per_replica is patched
    # Any other strategy (here the default one) goes to Keras' own reduction.
    assert patched({"loss": 1.0}, tf.distribute.get_strategy(), "mean") == {"loss": 1.0} and calls == ["mean"]
