"""DeiT's distillation token: a second prefix token with its own head, the two heads averaged at inference."""

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import checkpoints
from tests.layer_checks import randomize_weights

TINY = dict(patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2, image_size=(16, 24), classes=5)
IMAGES = np.random.default_rng(0).uniform(-2, 2, (3, 16, 24, 3)).astype("float32")


def distilled(**kwargs):
    model = keras_vit.ViT(**{**TINY, "distilled": True, **kwargs})
    randomize_weights(model, scale=0.3)
    return model


def test_two_prefix_tokens_and_two_heads():
    model = distilled(classifier_activation=None)
    config = model.vit_config
    assert config.num_prefix_tokens == 2 and model.get_layer("position_embedding").embedding.shape == (1, 2 + 6, 32)
    tokens = keras.Model(model.input, model.get_layer("encoder_norm").output)(IMAGES)
    assert tokens.shape == (3, 2 + 6, 32)
    heads = keras.Model(model.input, [model.get_layer("head").output, model.get_layer("head_dist").output])
    cls_logits, dist_logits = (np.asarray(h) for h in heads(IMAGES))
    head, head_dist = model.get_layer("head"), model.get_layer("head_dist")
    np.testing.assert_allclose(cls_logits, np.asarray(tokens)[:, 0] @ head.kernel.numpy() + head.bias.numpy(),
                               atol=1e-5)
    np.testing.assert_allclose(dist_logits, np.asarray(tokens)[:, 1] @ head_dist.kernel.numpy()
                               + head_dist.bias.numpy(), atol=1e-5)
    assert np.abs(cls_logits - dist_logits).max() > 1e-2  # two heads, two answers
    # Logits out: their mean (DeiT's and timm's eval output); probabilities out: its softmax.
    np.testing.assert_allclose(np.asarray(model(IMAGES)), (cls_logits + dist_logits) / 2, atol=1e-5)
    softmax = keras_vit.ViT(config, classifier_activation="softmax")
    softmax.set_weights(model.get_weights())
    expected = np.asarray(keras.ops.softmax((cls_logits + dist_logits) / 2))
    np.testing.assert_allclose(np.asarray(softmax(IMAGES)), expected, atol=1e-6)


def test_features_are_the_mean_of_the_two_tokens():
    model = distilled(include_top=False)
    tokens = np.asarray(keras.Model(model.input, model.get_layer("encoder_norm").output)(IMAGES))
    np.testing.assert_allclose(np.asarray(model(IMAGES)), (tokens[:, 0] + tokens[:, 1]) / 2, atol=1e-5)


def test_a_distilled_model_round_trips_through_its_files(tmp_path):
    model = distilled(classifier_activation=None)
    path = checkpoints.save_npz(model, tmp_path / "deit.npz")
    assert {"dist", "head_dist/kernel", "head_dist/bias"} <= set(checkpoints.read_npz(path))
    assert keras_vit.config_from_checkpoint(path) == model.vit_config
    loaded = keras_vit.ViT.from_checkpoint(path, classifier_activation=None)
    np.testing.assert_array_equal(np.asarray(loaded(IMAGES)), np.asarray(model(IMAGES)))
    model.save(tmp_path / "deit.keras")
    np.testing.assert_array_equal(np.asarray(keras.models.load_model(tmp_path / "deit.keras")(IMAGES)),
                                  np.asarray(model(IMAGES)))
    new_classes = keras_vit.ViT.from_checkpoint(path, classes=3)  # both heads restart at zero
    assert not new_classes.get_layer("head_dist").kernel.numpy().any()


def test_rollout_reads_past_both_prefix_tokens():
    model = distilled()
    maps = keras_vit.attention_maps(model, IMAGES)
    assert maps[0].shape == (3, 2, 8, 8)
    assert keras_vit.rollout_map(model, IMAGES).shape == (3, 16, 24)


@pytest.mark.parametrize("fields, message", [
    (dict(classifier="gap"), "distilled=True .* received classifier='gap'"),
    (dict(representation_size=8), "received classifier='token', representation_size=8"),
])
def test_what_deit_does_not_have_is_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        keras_vit.ViTConfig(distilled=True, **fields)


def test_deit_builders_use_deits_conventions():
    model = keras_vit.DeiT_Ti16(distilled=True, classes=10, image_size=32)
    config = model.vit_config
    assert (config.hidden_size, config.num_heads, config.distilled, config.gelu_approximate) == (192, 3, True, False)
    assert config.input_mean == keras_vit.config.IMAGENET_MEAN and model.name == "deit_ti16_distilled"


def test_a_distilled_model_averages_its_heads_logits_then_softmaxes():
    # DeiT's rule, (head + head_dist) / 2 on logits; averaging probabilities can pick another class.
    model = distilled()
    biases = {"head": [4.0, 0, 0, 0, 0], "head_dist": [-4.0, 2.0, 0, 0, 0]}
    for name, bias in biases.items():
        model.get_layer(name).kernel.assign(np.zeros((32, 5), "float32"))
        model.get_layer(name).bias.assign(np.array(bias, "float32"))
    logits = (np.array(biases["head"]) + np.array(biases["head_dist"])) / 2
    probabilities = np.asarray(model(np.zeros((1, 16, 24, 3), "float32")))[0]
    np.testing.assert_allclose(probabilities, np.exp(logits) / np.exp(logits).sum(), rtol=1e-5)
    assert probabilities.argmax() == 1


def test_export_reads_a_distilled_models_output_kind():
    from keras_vit.model import outputs_probabilities

    assert outputs_probabilities(distilled()) and not outputs_probabilities(
        distilled(classifier_activation=None))
