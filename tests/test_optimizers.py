import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import optimizers

ROOT = Path(__file__).resolve().parents[1]


def _tiny_vit():
    return keras_vit.ViT(patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2, image_size=16,
                         classes=3, classifier_activation=None)


def _train(optimizer, weights, steps=5):
    model = _tiny_vit()
    model.set_weights(weights)
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    images = np.random.default_rng(1).uniform(-1, 1, (8, 16, 16, 3)).astype("float32")
    for _ in range(steps):
        model.train_on_batch(images, np.arange(8) % 3)
    return model


class KerasAdamW(keras.optimizers.AdamW):
    """Keras' own update: `ViTModel.compile` gives only an instance of exactly Keras' class the fused one."""


class KerasAdam(keras.optimizers.Adam):
    """Keras' own update, as `KerasAdamW`."""


@pytest.mark.parametrize("ours, keras_own", [
    (lambda: optimizers.AdamW(1e-2, weight_decay=0.3), lambda: KerasAdamW(1e-2, weight_decay=0.3)),
    (lambda: optimizers.Adam(1e-2), lambda: KerasAdam(1e-2)),
    # Keras updates inside a cond branch every second step: the step's scalars are made in that branch's graph.
    (lambda: optimizers.AdamW(1e-2, gradient_accumulation_steps=2),
     lambda: KerasAdamW(1e-2, gradient_accumulation_steps=2)),
    # Keras' own class, made the fused one in place by compile.
    (lambda: keras.optimizers.AdamW(1e-2, weight_decay=0.3), lambda: KerasAdamW(1e-2, weight_decay=0.3)),
], ids=["with_weight_decay", "without_weight_decay", "accumulating_gradients", "keras_instance"])
def test_the_fused_update_trains_as_keras_own(ours, keras_own):
    """Several steps from identical weights: TensorFlow's Adam kernel with shared scalars computes Keras' formula."""
    keras.utils.set_random_seed(0)
    for variable in (initial := _tiny_vit()).trainable_variables:  # the head starts at zero: give it weights
        variable.assign(np.random.default_rng(2).normal(0, 0.1, variable.shape))
    weights = initial.get_weights()
    fused, reference = _train(ours(), weights), _train(keras_own(), weights)
    for a, b in zip(fused.trainable_weights, reference.trainable_weights, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6, err_msg=a.path)
    moved = [np.abs(a - b).max() for a, b in zip(fused.get_weights(), weights, strict=True)]
    assert np.median(moved) > 1e-2  # the weights moved far more than the tolerance


@pytest.mark.parametrize("name, keras_class", [("adamw", keras.optimizers.AdamW), ("AdamW", keras.optimizers.AdamW),
                                               ("adam", keras.optimizers.Adam), ("Adam", keras.optimizers.Adam)])
def test_compile_with_the_string_gives_the_fused_optimizer_with_keras_defaults(name, keras_class):
    model = _tiny_vit()
    model.compile(name, loss="mse")
    assert type(model.optimizer) is optimizers.FUSED[keras_class] and isinstance(model.optimizer, keras_class)
    ours, theirs = model.optimizer.get_config(), keras_class().get_config()
    assert ours.pop("name").startswith(theirs.pop("name").rsplit("_", 1)[0]) and ours == theirs


@pytest.mark.parametrize("keras_class", [keras.optimizers.AdamW, keras.optimizers.Adam])
def test_compile_gives_an_instance_of_keras_own_class_the_fused_update_in_place(keras_class):
    model = _tiny_vit()
    mine = keras_class(learning_rate=3e-4, beta_2=0.95, weight_decay=0.02, clipnorm=1.0)
    config = mine.get_config()
    model.compile(mine, loss="mse")
    assert model.optimizer is mine and type(mine) is optimizers.FUSED[keras_class] and isinstance(mine, keras_class)
    assert mine.get_config() == config  # the subclass adds no field: every argument as given
    model.train_on_batch(np.zeros((2, 16, 16, 3), "float32"), np.zeros((2, 3), "float32"))
    assert int(mine.iterations) == 1  # the caller's object is the one that trains


def test_compile_keeps_other_instances_and_strings():
    model = _tiny_vit()
    for mine in (KerasAdamW(), keras.optimizers.SGD(), keras.optimizers.Lion()):  # a subclass may change the update
        model.compile(mine, loss="mse")
        assert model.optimizer is mine and type(mine).__module__ != optimizers.__name__
    model.compile("sgd", loss="mse")
    assert type(model.optimizer) is keras.optimizers.SGD
    with pytest.raises(ValueError, match="adamx"):  # Keras' own error for a name it does not know
        model.compile("adamx", loss="mse")


def _update_graph(optimizer):
    import tensorflow as tf

    model = _tiny_vit()
    optimizer.build(model.trainable_variables)
    grads = [tf.ones(v.shape) for v in model.trainable_variables]
    graph = tf.function(lambda: optimizer.apply(grads, model.trainable_variables)).get_concrete_function().graph
    return [op.type for op in graph.get_operations()], len(model.trainable_variables)


def test_the_update_is_one_kernel_per_variable_with_the_step_scalars_once():
    ours, variables = _update_graph(optimizers.AdamW(1e-3, weight_decay=0.1))
    keras_own, _ = _update_graph(keras.optimizers.AdamW(1e-3, weight_decay=0.1))
    assert ours.count("ResourceApplyAdam") == variables and "ResourceApplyAdam" not in keras_own
    assert ours.count("Pow") == 2 and keras_own.count("Pow") == 2 * variables  # the step's powers, once
    assert len(ours) < 0.25 * len(keras_own)


def test_a_compiled_model_with_its_optimizer_loads_in_a_fresh_process(tmp_path):
    model = _train("adamw", _tiny_vit().get_weights(), steps=2)
    path = tmp_path / "m.keras"
    model.save(path)
    probe = ("import keras_vit, keras\n"
             f"m = keras.models.load_model({str(path)!r})\n"
             "o = m.optimizer\n"
             "print(type(o).__module__, type(o).__name__, int(o.iterations), o.weight_decay)")
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["keras_vit.optimizers", "AdamW", "2", "0.004"]
