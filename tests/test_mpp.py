"""Masked patch prediction: the corruption's statistics, the 3-bit colour targets, the network and its backbone."""

import numpy as np
import pytest

import keras_vit
from keras_vit import mpp
from keras_vit.config import IMAGENET_MEAN, IMAGENET_STD, ViTConfig
from keras_vit.layers import PatchCorruption

TINY = ViTConfig(patch_size=2, hidden_size=16, mlp_dim=32, num_heads=2, num_layers=1, image_size=8, classes=0,
                 classifier="gap")


def test_corruption_chooses_half_and_splits_them_80_10_10():
    """Each patch's embedding is its own index, so every outcome can be read back from the output."""
    batch, side, hidden, draws = 16, 8, 2, 20
    count = batch * side * side
    index = np.arange(count, dtype="float32")
    patches = np.stack([index, -index], axis=-1).reshape(batch, side, side, hidden)
    layer = PatchCorruption(seed=3)
    layer.build(patches.shape)
    layer.mask_embedding.assign(np.full(hidden, 0.5, "float32"))  # no patch's embedding
    outcomes = {"chosen": 0, "masked": 0, "random": 0, "kept": 0}
    for _ in range(draws):
        corrupted, chosen = (np.asarray(t) for t in layer(patches))
        corrupted, chosen = corrupted.reshape(count, hidden), chosen.reshape(count).astype(bool)
        own = corrupted[:, 0] == index
        masked = (corrupted == 0.5).all(axis=1)
        other = ~own & ~masked
        assert own[~chosen].all(), "a patch not chosen was changed"
        assert (corrupted[other, 1] == -corrupted[other, 0]).all(), "a random patch is not another patch"
        outcomes["chosen"] += chosen.sum()
        outcomes["masked"] += masked.sum()
        outcomes["random"] += other.sum()
        outcomes["kept"] += (chosen & own).sum()
    total = draws * count
    # Within 4 standard deviations of the binomial draws.
    assert abs(outcomes["chosen"] / total - 0.5) < 4 * np.sqrt(0.25 / total)
    n = outcomes["chosen"]
    for name, p in (("masked", 0.8), ("random", 0.1), ("kept", 0.1)):
        assert abs(outcomes[name] / n - p) < 4 * np.sqrt(p * (1 - p) / n), (name, outcomes[name] / n)


def test_corruption_draws_differ_between_calls_and_follow_the_seed():
    patches = np.random.default_rng(0).normal(size=(2, 4, 4, 8)).astype("float32")
    first, second = PatchCorruption(seed=1), PatchCorruption(seed=1)
    a, b = np.asarray(first(patches)[1]), np.asarray(first(patches)[1])
    assert not np.array_equal(a, b)
    np.testing.assert_array_equal(a, np.asarray(second(patches)[1]))


@pytest.mark.parametrize("kwargs, message", [
    (dict(rate=0.0), "`rate` must be in"),
    (dict(mask_fraction=0.9, random_fraction=0.2), "with a sum <= 1"),
])
def test_corruption_arguments_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PatchCorruption(**kwargs)


def _hand_targets(pixels, patch):
    """Reference: loop over patches, average each channel, 8 bins, base-8 number (first channel first)."""
    batch, height, width, channels = pixels.shape
    out = np.zeros((batch, (height // patch) * (width // patch)), "int64")
    for b in range(batch):
        for i in range(height // patch):
            for j in range(width // patch):
                mean = pixels[b, i * patch:(i + 1) * patch, j * patch:(j + 1) * patch].reshape(-1, channels).mean(0)
                levels = [min(int(np.floor(m / 255 * 8)), 7) for m in mean]
                out[b, i * (width // patch) + j] = sum(level * 8 ** (channels - 1 - c)
                                                       for c, level in enumerate(levels))
    return out


def test_colour_targets_match_hand_computed_ones():
    # Known patches: pure red -> (7, 0, 0) = 448; half white -> 4 per channel = 292; 31 -> level 0; 32 -> 1.
    pixels = np.zeros((1, 4, 4, 3), "float32")
    pixels[0, :2, :2] = (255, 0, 0)
    pixels[0, :2, 2:] = ((255, 255, 255), (0, 0, 0))  # rows of the patch: white then black
    pixels[0, 2:, :2] = (31, 32, 255)
    config = TINY.replace(image_size=4, channels=3)
    targets = np.asarray(mpp.colour_targets(keras_vit.preprocess_input(pixels, config=config), config))
    np.testing.assert_array_equal(targets, [[448, 292, 0 * 64 + 1 * 8 + 7, 0]])
    rng = np.random.default_rng(0)
    random_pixels = rng.integers(0, 256, size=(3, 8, 8, 3)).astype("float32")
    imagenet = TINY.replace(channels=3, input_mean=IMAGENET_MEAN, input_std=IMAGENET_STD)
    inputs = keras_vit.preprocess_input(random_pixels, config=imagenet)
    np.testing.assert_array_equal(mpp.colour_targets(inputs, imagenet), _hand_targets(random_pixels, 2))


def test_grey_images_have_8_colour_classes():
    pixels = np.random.default_rng(1).integers(0, 256, size=(2, 8, 8, 1)).astype("float32")
    config = TINY.replace(channels=1, input_mean=(0.5,), input_std=(0.5,))
    np.testing.assert_array_equal(mpp.colour_targets(keras_vit.preprocess_input(pixels, config=config), config),
                                  _hand_targets(pixels, 2))
    assert mpp.colour_classes(1) == 8 and mpp.colour_classes(3) == 512


@pytest.mark.parametrize("fields", [dict(), dict(classifier="token", distilled=True),
                                    # layers on the pooled vector, which MPP does not train
                                    dict(fc_norm=True), dict(representation_size=8)])
def test_network_predicts_every_patch_and_its_backbone_carries_the_weights(fields, tmp_path):
    network = mpp.mpp_network(TINY.replace(**fields), input_shape=(8, 8, 3), seed=0)
    images = np.random.default_rng(0).uniform(-1, 1, (2, 8, 8, 3)).astype("float32")
    outputs = network(images)
    assert tuple(outputs["logits"].shape) == (2, 16, 512) and tuple(outputs["chosen"].shape) == (2, 16)
    for weight in network.get_layer("encoder_block_0").weights:
        weight.assign(np.random.default_rng(1).normal(size=weight.shape).astype("float32"))
    backbone = mpp.backbone(network)
    assert backbone.output_shape == (None, fields.get("representation_size", 16)) and backbone.vit_config.classes == 0
    for a, b in zip(backbone.get_layer("encoder_block_0").get_weights(),
                    network.get_layer("encoder_block_0").get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    # Fine-tuning starts from the backbone's official file: the encoder as pre-trained, the head at zero.
    keras_vit.save_npz(backbone, tmp_path / "mpp.npz")
    fine = keras_vit.ViT(TINY.replace(**fields), classes=10, input_shape=(8, 8, 3), weights=str(tmp_path / "mpp.npz"))
    np.testing.assert_array_equal(fine.get_layer("encoder_block_0").get_weights()[0],
                                  network.get_layer("encoder_block_0").get_weights()[0])
    assert not np.asarray(fine.get_layer("head").kernel).any()


def test_a_hybrid_is_refused():
    with pytest.raises(ValueError, match="hybrid's ResNet stem"):
        mpp.mpp_network(TINY.replace(resnet_num_layers=(1,), patch_size=1), input_shape=(8, 8, 3))


def test_patch_dropout_is_refused():
    # The network predicts every patch from its own output token: a dropped patch would have none.
    with pytest.raises(ValueError, match=r"predicts every patch .* received patch_dropout=0.5: use patch_dropout=0"):
        mpp.mpp_network(TINY.replace(patch_dropout=0.5), input_shape=(8, 8, 3))
