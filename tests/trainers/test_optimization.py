import keras
import numpy as np
import pytest

import keras_vit
from trainers import optimization, recipes


def test_schedule_warms_up_then_decays_to_zero():
    cosine = optimization.WarmupSchedule(1.0, warmup_steps=10, total_steps=110, decay="cosine")
    values = [float(cosine(s)) for s in (0, 5, 10, 60, 110, 200)]
    np.testing.assert_allclose(values, [0.0, 0.5, 1.0, 0.5, 0.0, 0.0], atol=1e-6)
    linear = optimization.WarmupSchedule(2.0, warmup_steps=0, total_steps=100, decay="linear")
    np.testing.assert_allclose([float(linear(s)) for s in (0, 25, 100)], [2.0, 1.5, 0.0], atol=1e-6)
    constant = optimization.WarmupSchedule(0.3, warmup_steps=4, total_steps=100, decay="constant")
    np.testing.assert_allclose([float(constant(s)) for s in (2, 50)], [0.15, 0.3], atol=1e-6)


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
    assert type(optimization.make_optimizer(recipe, model)) is keras.optimizers.Adam
