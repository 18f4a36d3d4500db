"""keras_vit.fine_tuning and keras_vit.layer_decay on TensorFlow (tests/backends runs the same checks on JAX and
PyTorch): the rate scales and weight decay of layer decay, the EMA's arithmetic, its swap, the refusals."""

import dataclasses

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import optimizers
from keras_vit.fine_tuning import averaged_weights, fine_tuning_optimizer
from keras_vit.layer_decay import layer_decay_scales
from tests import fine_tuning_checks as checks


@pytest.mark.parametrize("optimizer_class", [keras.optimizers.Adam, optimizers.Adam], ids=["keras", "fused"])
@pytest.mark.parametrize("scan_layers", [False, True], ids=["unrolled", "scanned"])
def test_adams_first_step_is_the_rate_times_each_depths_scale(optimizer_class, scan_layers):
    """Block i of L takes decay^(L - i) of the rate, the embeddings (registers included) decay^(L + 1), the final
    norm and head 1: measured on Adam's first step, whose size is the rate, per weight (per block when stacked)."""
    measured, expected = checks.first_step(optimizer_class, scan_layers)
    assert checks._worst(measured, expected) < 2e-3
    assert {"register_tokens/tokens", "head/kernel"} <= set(measured)


@pytest.mark.parametrize("optimizer_class", [keras.optimizers.AdamW, optimizers.AdamW], ids=["keras", "fused"])
def test_decoupled_weight_decay_takes_the_scaled_rate(optimizer_class):
    """As timm's groups: w -= (lr x scale) wd w (a zero loss leaves the decay alone), the scanned blocks included."""
    measured, expected = checks.first_step(optimizer_class, scan_layers=True, zero_loss=True)
    assert checks._worst(measured, expected) < 2e-3


def test_every_weight_has_one_scale_and_the_prefix_tokens_and_stem_go_with_the_embeddings():
    config = keras_vit.ViTConfig(image_size=(32, 32), patch_size=(8, 8), hidden_size=16, num_layers=2, num_heads=2,
                                 mlp_dim=32, resnet_num_layers=(1,), distilled=True, norm_pre=True)
    model = keras_vit.ViT(config, classes=3)
    scales = layer_decay_scales(model, 0.75)
    assert sorted(scales) == sorted(v.path for v in model.trainable_variables)
    embeddings = [p for p in scales if p.split("/")[0] in ("resnet_stem", "patch_embedding", "class_token",
                                                           "distillation_token", "position_embedding", "norm_pre")]
    assert len(embeddings) > 10 and {scales[p] for p in embeddings} == {0.75 ** 3}
    assert {scales[p] for p in scales if p.startswith("encoder_block_1/")} == {0.75}
    assert {scales[p] for p in scales if p.startswith(("encoder_norm/", "head"))} == {1.0}


def test_a_model_holding_a_vit_is_grouped_by_its_blocks():
    """A Distiller or the MPP network holds the ViT: its weights keep their block names."""
    vit = checks.tiny_vit()
    inputs = keras.Input((16, 16, 3))
    holder = keras.Model(inputs, vit(inputs), name="holder")
    assert layer_decay_scales(holder, 0.5) == layer_decay_scales(vit, 0.5)


@pytest.mark.parametrize("warmup", [True, False], ids=["warmup", "constant"])
def test_the_ema_is_timms_model_ema_v3_and_the_weights_come_back(warmup):
    trajectory, average, restored = checks.ema_trajectory(warmup)
    expected = checks.expected_average(trajectory, warmup)
    for path, value in expected.items():
        np.testing.assert_allclose(average[path], value, rtol=0, atol=2e-6, err_msg=path)
        np.testing.assert_array_equal(restored[path], trajectory[-1][path], err_msg=path)
    # The average is not the last weights: the check above could fail.
    assert max(np.abs(average[p] - trajectory[-1][p]).max() for p in average) > 1e-3


def test_fit_ends_with_the_average_unless_told_not_to():
    images, labels = checks.batch(8)
    finals = {}
    for finalize in (True, False):
        model = checks.tiny_vit()
        model.compile(optimizer=fine_tuning_optimizer(keras.optimizers.SGD(0.1), ema_decay=0.5,
                                                      ema_finalize=finalize),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(images, labels, batch_size=4, epochs=1, verbose=0)
        with averaged_weights(model):
            average = model.get_weights()
        finals[finalize] = (model.get_weights(), average)
    weights, average = finals[True]
    assert all(np.array_equal(w, a) for w, a in zip(weights, average, strict=True))
    weights, average = finals[False]
    assert not all(np.array_equal(w, a) for w, a in zip(weights, average, strict=True))


def test_the_optimizer_keeps_its_class_arguments_and_options_through_serialisation():
    model = checks.tiny_vit(scan_layers=True)
    optimizer = fine_tuning_optimizer(keras.optimizers.AdamW(3e-4, weight_decay=0.05, beta_2=0.95), model,
                                      layer_decay=0.65, ema_decay=0.999, ema_warmup=False)
    assert isinstance(optimizer, keras.optimizers.AdamW) and optimizer.beta_2 == 0.95 and optimizer.use_ema
    again = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert type(again) is type(optimizer) and again.get_config() == optimizer.get_config()
    assert again.layer_decay_scales["encoder/attention-query_kernel"] == [0.65 ** 3, 0.65 ** 2, 0.65]


def test_bad_values_are_refused_by_name():
    model = checks.tiny_vit()
    with pytest.raises(ValueError, match=r"`layer_decay` must be in \(0, 1\].*received 1.5"):
        fine_tuning_optimizer(keras.optimizers.Adam(), model, layer_decay=1.5)
    with pytest.raises(ValueError, match=r"`ema_decay` must be in \(0, 1\); received 1.0"):
        fine_tuning_optimizer(keras.optimizers.Adam(), ema_decay=1.0)
    with pytest.raises(ValueError, match="pass the model too"):
        fine_tuning_optimizer(keras.optimizers.Adam(), layer_decay=0.5)
    built = keras.optimizers.Adam()
    built.build(model.trainable_variables)
    with pytest.raises(ValueError, match="not yet built"):
        fine_tuning_optimizer(built, ema_decay=0.9)
    dense = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)], name="dense")
    with pytest.raises(ValueError, match="'dense' has no trainable 'encoder_block_0'"):
        layer_decay_scales(dense, 0.5)
    other = keras_vit.ViT(dataclasses.replace(model.vit_config, num_layers=2), classes=3)
    optimizer = fine_tuning_optimizer(keras.optimizers.Adam(), other, layer_decay=0.5)
    with pytest.raises(ValueError, match="made for another model"):
        optimizer.build(checks.tiny_vit(scan_layers=True).trainable_variables)
