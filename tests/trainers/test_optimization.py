import keras
import numpy as np
import pytest

import keras_vit
from tests.test_optimizers import KerasAdamW
from trainers import optimization, recipes


def test_schedule_warms_up_then_decays_to_zero():
    cosine = optimization.WarmupSchedule(1.0, warmup_steps=10, total_steps=110, decay="cosine")
    values = [float(cosine(s)) for s in (0, 5, 10, 60, 110, 200)]
    np.testing.assert_allclose(values, [0.0, 0.5, 1.0, 0.5, 0.0, 0.0], atol=1e-6)
    linear = optimization.WarmupSchedule(2.0, warmup_steps=0, total_steps=100, decay="linear")
    np.testing.assert_allclose([float(linear(s)) for s in (0, 25, 100)], [2.0, 1.5, 0.0], atol=1e-6)
    constant = optimization.WarmupSchedule(0.3, warmup_steps=4, total_steps=100, decay="constant")
    np.testing.assert_allclose([float(constant(s)) for s in (2, 50)], [0.15, 0.3], atol=1e-6)
    with pytest.raises(ValueError, match=r"`decay` must be one of \('cosine', .*\); received decay='cosin'"):
        optimization.WarmupSchedule(1.0, warmup_steps=10, total_steps=110, decay="cosin")  # ran as a constant


def test_batch_scaled_learning_rate():
    assert optimization.peak_learning_rate(recipes.RECIPES["deit"]) == pytest.approx(1e-3)


@pytest.mark.parametrize("name", ["adamw", "adam", "sgd"])
def test_weight_decay_applies_to_kernels_only(name):
    model = keras_vit.ViT(patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1, image_size=16,
                          classes=3, representation_size=8)
    for v in model.trainable_variables:
        v.assign(np.ones(v.shape, "float32"))
    recipe = recipes.RECIPES["digits"].replace(optimizer=name, weight_decay=0.5, warmup_steps=0,
                                               schedule="constant", learning_rate=0.1)
    optimizer = optimization.make_optimizer(recipe, model)
    optimizer.apply_gradients([(keras.ops.zeros(v.shape), v) for v in model.trainable_variables])
    decayed = {v.path for v in model.trainable_variables if not np.allclose(v.numpy(), 1.0)}
    kernels = {v.path for v in model.trainable_variables if v.name.endswith("kernel")}
    assert decayed == kernels and "class_token/token" not in decayed
    assert np.allclose(model.get_layer("patch_embedding").kernel.numpy(), 1 - 0.1 * 0.5)


def test_adamw_without_weight_decay_is_adam():
    """Keras' AdamW refuses weight_decay=None; a recipe with adamw and no decay (as mpp_pretrain's) still builds."""
    model = keras_vit.ViT(patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1, image_size=16,
                          classes=3)
    recipe = recipes.RECIPES["digits"].replace(optimizer="adamw", weight_decay=0.0)
    optimizer = optimization.make_optimizer(recipe, model)
    assert type(optimizer) is optimization.Adam and optimizer.weight_decay is None


def _tiny_training(optimizer, jit_compile, steps=5):
    keras.utils.set_random_seed(0)
    model = keras_vit.ViT(patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2, image_size=16,
                          classes=3, classifier_activation=None)
    optimizer.exclude_from_weight_decay(
        var_list=[v for v in model.trainable_variables if not v.name.endswith("kernel")])
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=jit_compile)
    images = np.random.default_rng(1).uniform(-1, 1, (8, 16, 16, 3)).astype("float32")
    for _ in range(steps):
        model.train_on_batch(images, np.arange(8) % 3)
    return model


@pytest.mark.parametrize("jit_compile", [False, True])
def test_the_recipes_adam_updates_as_keras_adamw(jit_compile):
    """Decay on kernels only, a warm-up schedule, five steps: TensorFlow's Adam kernel computes Keras' formula."""
    def schedule():
        return optimization.WarmupSchedule(1e-2, warmup_steps=2, total_steps=10)

    ours = _tiny_training(optimization.Adam(schedule(), weight_decay=0.3), jit_compile)
    keras_own = _tiny_training(KerasAdamW(schedule(), weight_decay=0.3), jit_compile)  # Keras' own update
    for a, b in zip(ours.trainable_weights, keras_own.trainable_weights, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=2e-5, err_msg=a.path)
    initial = _tiny_training(optimization.Adam(schedule()), jit_compile, steps=0)
    moved = [np.abs(a.numpy() - b.numpy()).max()
             for a, b in zip(ours.trainable_weights, initial.trainable_weights, strict=True)]
    assert np.median(moved) > 1e-2  # the weights moved far more than the tolerance


def test_the_recipes_adam_is_one_kernel_per_variable():
    import tensorflow as tf

    def update_graph(optimizer):
        model = keras_vit.ViT(patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2, image_size=16)
        optimizer.build(model.trainable_variables)
        grads = [tf.ones(v.shape) for v in model.trainable_variables]
        graph = tf.function(lambda: optimizer.apply(grads, model.trainable_variables)).get_concrete_function().graph
        return [op.type for op in graph.get_operations()], len(model.trainable_variables)

    ours, variables = update_graph(optimization.Adam(1e-3, weight_decay=0.1))
    keras_own, _ = update_graph(keras.optimizers.AdamW(1e-3, weight_decay=0.1))
    assert ours.count("ResourceApplyAdam") == variables and "ResourceApplyAdam" not in keras_own
    assert len(ours) < 0.6 * len(keras_own)
