import re

import keras
import numpy as np
import pytest

import keras_vit
from tests import reference
from tests.layer_checks import randomize_weights

TINY = dict(patch_size=8, hidden_size=64, mlp_dim=128, num_heads=4, num_layers=2)
IMAGES = np.random.default_rng(0).uniform(-1, 1, (2, 32, 48, 3)).astype("float32")


def tiny(**kwargs):
    kwargs = {"image_size": (32, 48), "classes": 10, "classifier_activation": None, **kwargs}
    return keras_vit.ViT(**TINY, **kwargs)


def shapes_only(builder, **kwargs):
    """`builder(**kwargs)` whose variables have shapes and no values (`StatelessScope(initialize_variables=False)`):
    counts and names need nothing else, and drawing H/14's 632M random weights took seconds."""
    with keras.StatelessScope(initialize_variables=False):
        return builder(**kwargs)


def count(builder, **kwargs):
    return shapes_only(builder, **kwargs).count_params()


def official_count(patch, width, mlp, layers, image=224, classes=1000, channels=3):
    """Parameter count from the architecture alone (class token, learned 1-D)."""
    tokens = (image // patch) ** 2 + 1
    block = 2 * 2 * width + 4 * (width * width + width) + 2 * width * mlp + mlp + width
    return (patch * patch * channels * width + width) + width + tokens * width \
        + layers * block + 2 * width + width * classes + classes


def test_official_parameter_counts():
    # The figures the official checkpoints have (issue 2, Model Garden, KerasHub).
    assert count(keras_vit.ViT_B16) == 86_567_656
    assert count(keras_vit.ViT_L16) == 304_326_632
    assert count(keras_vit.ViT_H14) == 632_045_800
    assert count(keras_vit.ViT_B16, include_top=False) == 85_798_656


# vit_jax/models_test.py: the parameter counts of the official configurations.
OFFICIAL_COUNTS = {
    "R_ViT_Ti16": 6_337_704, "R26_ViT_S32": 36_431_912, "R26_ViT_B32": 101_383_976,
    "R50_ViT_B16": 98_659_112, "R50_ViT_L32": 328_994_856, "ViT_B8": 86_576_872,
    "ViT_S32": 22_878_952, "ViT_Ti16": 5_717_416,
}


@pytest.mark.parametrize("builder", sorted(OFFICIAL_COUNTS))
def test_official_counts_of_hybrids_and_small_variants(builder):
    assert count(getattr(keras_vit, builder)) == OFFICIAL_COUNTS[builder]


def test_gap_without_representation_count():
    # 'ViT-B_16-gap-norep' in vit_jax/models_test.py: no class token, one row less.
    assert count(keras_vit.ViT_B16, classifier="gap") == 86_566_120


@pytest.mark.parametrize("builder, variant", [
    ("ViT_Ti16", (16, 192, 768, 12)), ("ViT_S16", (16, 384, 1536, 12)), ("ViT_S32", (32, 384, 1536, 12)),
    ("ViT_B8", (8, 768, 3072, 12)), ("ViT_B32", (32, 768, 3072, 12)), ("ViT_L32", (32, 1024, 4096, 24)),
])
def test_every_named_builder(builder, variant):
    model = shapes_only(getattr(keras_vit, builder))
    assert model.count_params() == official_count(*variant)
    assert model.name == builder.lower()
    assert getattr(keras_vit, builder).__doc__.startswith("Builds ViT-")


def test_l16_at_384_for_10_classes():
    model = shapes_only(keras_vit.ViT_L16, classes=10, image_size=384)
    assert model.input_shape == (None, 384, 384, 3) and model.output_shape == (None, 10)
    assert model.get_layer("position_embedding").embedding.shape == (1, 577, 1024)


def test_forward_matches_the_reference_numerics():
    model = tiny(representation_size=16)
    randomize_weights(model, scale=0.2)
    x = IMAGES.astype(np.float64)

    def w(name):
        return [np.asarray(v.numpy(), np.float64) for v in model.get_layer(name).weights]

    kernel, bias = w("patch_embedding")
    patches = np.einsum("bhpwqc,pqcd->bhwd", x.reshape(2, 4, 8, 6, 8, 3), kernel) + bias
    (cls,) = w("class_token")
    (pos,) = w("position_embedding")
    tokens = np.concatenate([np.broadcast_to(cls, (2, 1, 64)), patches.reshape(2, 24, 64)], 1) + pos
    for i in range(2):
        tokens = reference.encoder_block(tokens, reference.block_weights(model.get_layer(f"encoder_block_{i}")))
    tokens = reference.layer_norm(tokens, *w("encoder_norm"))
    pre = np.tanh(tokens[:, 0] @ w("pre_logits")[0] + w("pre_logits")[1])
    logits = pre @ w("head")[0] + w("head")[1]
    np.testing.assert_allclose(np.asarray(model(IMAGES)), logits, atol=1e-4)
    assert np.abs(logits).max() > 0.1


def test_head_starts_at_zero_and_softmax_is_the_default():
    model = keras_vit.ViT(**TINY, image_size=32, classes=5)
    assert not model.get_layer("head").kernel.numpy().any()
    np.testing.assert_allclose(np.asarray(model(IMAGES[:, :, :32])), 0.2, atol=1e-6)


@pytest.mark.parametrize("config", [{}, {"position_embedding": "learned_2d", "image_size": 32},
                                    {"position_embedding": "relative_2d"}, {"scan_layers": True}])
def test_every_random_weight_draws_values_of_its_own(config):
    # A Keras initializer fixes its seed when it is made, so one shared by two weights gives both the same
    # values: the attention's query, key, value and output kernels all started equal that way once, and
    # so did learned_2d's row and column tables on a square grid.
    model = tiny(**config)
    draws = {}
    for weight in model.weights:
        value = np.asarray(weight)
        for i, draw in enumerate(value if "encoder/" in weight.path and config.get("scan_layers") else [value]):
            if np.unique(draw).size > 1:  # not a constant (zeros, ones)
                draws.setdefault(np.sort(draw, axis=None).tobytes(), []).append(f"{weight.path}[{i}]")
    assert len(draws) > 4 * TINY["num_layers"]
    assert [paths for paths in draws.values() if len(paths) > 1] == []


def test_without_top_returns_pooled_features_and_tokens_are_reachable():
    model = tiny(include_top=False)
    randomize_weights(model, scale=0.2)
    tokens_model = keras.Model(model.input, model.get_layer("encoder_norm").output)
    tokens = np.asarray(tokens_model(IMAGES))
    assert tokens.shape == (2, 1 + 24, 64) and model.output_shape == (None, 64)
    np.testing.assert_allclose(np.asarray(model(IMAGES)), tokens[:, 0], atol=1e-6)
    avg = tiny(include_top=False, pooling="avg")
    avg.set_weights(model.get_weights())
    np.testing.assert_allclose(np.asarray(avg(IMAGES)), tokens[:, 1:].mean(1), atol=1e-5)
    gap = tiny(include_top=False, classifier="gap")
    assert len(gap.get_layer("encoder_norm").output.shape) == 3 and gap.get_layer("encoder_norm").output.shape[1] == 24


@pytest.mark.parametrize("position_embedding",
                         ["learned_1d", "learned_2d", "sincos_2d", "relative", "relative_2d", "none"])
@pytest.mark.parametrize("classifier", ["token", "gap"])
def test_keras_file_round_trip_in_safe_mode(tmp_path, position_embedding, classifier):
    model = tiny(position_embedding=position_embedding, classifier=classifier, representation_size=16)
    randomize_weights(model, scale=0.2)
    model.save(tmp_path / "m.keras")
    reloaded = keras.models.load_model(tmp_path / "m.keras", safe_mode=True)
    expected = np.asarray(model(IMAGES))
    np.testing.assert_array_equal(np.asarray(reloaded(IMAGES)), expected)
    assert np.abs(expected).max() > 1e-2
    assert isinstance(reloaded, keras_vit.ViTModel) and reloaded.vit_config == model.vit_config


def test_timm_conventions_compute_what_they_say():
    """class token kept out of the mean, fc_norm after pooling, no position for the class token, exact GELU."""
    model = tiny(classifier="gap", class_token=True, fc_norm=True, gelu_approximate=False, include_top=False)
    randomize_weights(model, scale=0.2)
    names = [layer.name for layer in model.layers]
    assert "fc_norm" in names and "encoder_norm" not in names
    tokens = keras.Model(model.input, model.get_layer("encoder_block_1").output)(IMAGES)
    norm = model.get_layer("fc_norm")
    np.testing.assert_allclose(np.asarray(model(IMAGES)), np.asarray(norm(np.asarray(tokens)[:, 1:].mean(1))),
                               atol=1e-5)
    assert model.get_layer("encoder_block_0").mlp.gelu_approximate is False
    no_embed = tiny(no_embed_class=True)
    table = no_embed.get_layer("position_embedding").embedding
    assert tuple(table.shape) == (1, 24, 64)  # the grid only: the class token gets no position


def test_uint8_input_is_accepted_and_cast():
    model = tiny()
    randomize_weights(model, scale=0.2)
    pixels = np.random.default_rng(1).integers(0, 256, (2, 32, 48, 3))
    np.testing.assert_allclose(
        np.asarray(model(pixels.astype("uint8"))), np.asarray(model(pixels.astype("float32"))), rtol=1e-6)
    uint8_input = keras.Input((32, 48, 3), dtype="uint8")
    typed = tiny(input_tensor=uint8_input)
    typed.set_weights(model.get_weights())
    assert typed.input.dtype == "uint8"
    np.testing.assert_allclose(
        np.asarray(typed(pixels.astype("uint8"))), np.asarray(model(pixels.astype("float32"))), rtol=1e-6)


def test_input_shape_sets_the_resolution_and_channels():
    model = keras_vit.ViT(**TINY, input_shape=(40, 24, 1), classes=3)
    assert model.input_shape == (None, 40, 24, 1)
    assert model.get_layer("position_embedding").grid_size == (5, 3)


def test_mixed_bfloat16_computes_in_bf16_and_returns_float32_logits():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    model = tiny(representation_size=16)
    randomize_weights(model, scale=0.2)
    tokens = keras.Model(model.input, model.get_layer("position_embedding").output)(IMAGES)
    assert tokens.dtype == "bfloat16"
    assert model.get_layer("position_embedding").embedding.dtype == "float32"
    logits = model(IMAGES)
    assert logits.dtype == "float32"
    assert tiny(distilled=True)(IMAGES).dtype == "float32"  # through the average of its two heads
    keras.mixed_precision.set_global_policy("float32")
    reference_model = tiny(representation_size=16)
    reference_model.set_weights(model.get_weights())
    np.testing.assert_allclose(np.asarray(logits), np.asarray(reference_model(IMAGES)), atol=0.1)


def test_scan_layers_is_the_same_model_with_stacked_blocks():
    config = dict(position_embedding="relative", dropout_rate=0.1, drop_path_rate=0.1)  # inactive at inference
    unrolled, scanned = tiny(**config), tiny(**config, scan_layers=True)
    randomize_weights(unrolled, scale=0.2)
    blocks = [unrolled.get_layer(f"encoder_block_{i}") for i in range(TINY["num_layers"])]
    scanned.get_layer("encoder").load_blocks(blocks)
    for layer in scanned.layers:
        if layer.name != "encoder":
            layer.set_weights(unrolled.get_layer(layer.name).get_weights())
    assert scanned.count_params() == unrolled.count_params()
    np.testing.assert_allclose(np.asarray(scanned(IMAGES)), np.asarray(unrolled(IMAGES)), atol=1e-5)


def test_scan_layers_under_mixed_bfloat16():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    model = tiny(scan_layers=True)
    assert model.get_layer("encoder").weights[0].dtype == "float32"
    randomize_weights(model, scale=0.2)
    assert keras.Model(model.input, model.get_layer("encoder").output)(IMAGES).dtype == "bfloat16"
    logits = model(IMAGES)
    assert logits.dtype == "float32"
    keras.mixed_precision.set_global_policy("float32")
    reference_model = tiny(scan_layers=True)
    reference_model.set_weights(model.get_weights())
    np.testing.assert_allclose(np.asarray(logits), np.asarray(reference_model(IMAGES)), atol=0.1)


@pytest.mark.slow
@pytest.mark.parametrize("batch", [3, 5])
def test_xla_training_on_rectangular_inputs_at_any_batch_size(batch):
    model = tiny(drop_path_rate=0.1, dropout_rate=0.1, position_embedding="relative")
    model.compile(optimizer=keras.optimizers.Adam(1e-3), jit_compile=True,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.default_rng(2).uniform(-1, 1, (4 * batch, 32, 48, 3)).astype("float32")
    y = np.arange(4 * batch) % 10
    before = [w.numpy().copy() for w in model.trainable_weights]
    history = model.fit(x, y, batch_size=batch, epochs=3, verbose=0)
    losses = history.history["loss"]
    assert np.isfinite(losses).all() and losses[-1] < losses[0]
    assert all(not np.array_equal(b, w.numpy()) for b, w in zip(before, model.trainable_weights, strict=True))


@pytest.mark.parametrize("jit_compile", [False, True])
def test_the_first_training_step_is_traced_once(jit_compile):
    # Keras' TensorFlow trainer would build the optimizer inside the first trace, and tf.function then traces
    # a second time; ViTModel builds it first.
    model = tiny()
    model.compile(optimizer=keras.optimizers.AdamW(1e-3), jit_compile=jit_compile,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=[keras.metrics.SparseCategoricalAccuracy()])
    traces, train_step = [], model.train_step
    model.train_step = lambda data: (traces.append(1), train_step(data))[1]
    before = [w.numpy().copy() for w in model.trainable_weights]
    for _ in range(2):
        model.train_on_batch(IMAGES, np.arange(2))
    assert len(traces) == 1
    assert all(not np.array_equal(b, w.numpy()) for b, w in zip(before, model.trainable_weights, strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("position_embedding", ["learned_1d", "learned_2d", "sincos_2d", "relative"])
def test_dynamic_image_size_under_xla_fit(position_embedding):
    model = tiny(dynamic_image_size=True, position_embedding=position_embedding)
    assert model.input_shape == (None, None, None, 3)
    randomize_weights(model, scale=0.1)
    model.compile(optimizer=keras.optimizers.SGD(1e-3), jit_compile=True,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(3)
    for shape in [(32, 48), (64, 64), (32, 48)]:  # a new size retraces; a size seen before reuses its trace
        x = rng.uniform(-1, 1, (4, *shape, 3)).astype("float32")
        history = model.fit(x, np.arange(4), batch_size=4, epochs=1, verbose=0)
        assert np.isfinite(history.history["loss"]).all()
        eager = np.asarray(model(x))
        np.testing.assert_allclose(model.predict(x, verbose=0), eager, atol=1e-4)


def test_dynamic_model_at_a_new_size_equals_a_model_built_for_it():
    dynamic = tiny(dynamic_image_size=True)
    randomize_weights(dynamic, scale=0.2)
    fixed = tiny(image_size=(64, 40))
    for layer in fixed.layers:
        source = dynamic.get_layer(layer.name)
        if layer.name == "position_embedding":
            layer.set_weights([source.resized_weights((8, 5))["embedding"]])
        else:
            layer.set_weights(source.get_weights())
    x = np.random.default_rng(4).uniform(-1, 1, (2, 64, 40, 3)).astype("float32")
    np.testing.assert_allclose(np.asarray(dynamic(x)), np.asarray(fixed(x)), atol=1e-5)
    # At its own resolution a dynamic model is exactly a fixed one.
    same = tiny()
    same.set_weights(dynamic.get_weights())
    np.testing.assert_array_equal(np.asarray(dynamic(IMAGES)), np.asarray(same(IMAGES)))


def copy_weights(source, target):
    """`source`'s weights into `target`'s of the same paths (a PatchDropout layer adds only its seed's state)."""
    weights = {w.path: w for w in source.weights}
    for w in target.weights:
        w.assign(weights[w.path])


@pytest.mark.parametrize("fields", [dict(remat=True), dict(scan_layers=True, remat=True)])
def test_patch_dropout_leaves_inference_alone_and_trains_the_encoder_on_fewer_tokens(fields):
    model, plain = tiny(patch_dropout=0.3, **fields), tiny(**fields)
    randomize_weights(plain, scale=0.2)
    copy_weights(plain, model)
    np.testing.assert_array_equal(np.asarray(model(IMAGES)), np.asarray(plain(IMAGES)))
    encoder = keras.Model(model.input, model.get_layer("encoder" if fields.get("scan_layers") else "encoder_block_1")
                          .output)
    # The 4 x 6 grid keeps int(24 x 0.7) = 16 patches beside the class token, in training only.
    assert encoder(IMAGES, training=True).shape == (2, 1 + 16, 64)
    assert encoder(IMAGES).shape == (2, 1 + 24, 64)
    model.compile(keras.optimizers.SGD(0.1), keras.losses.MeanSquaredError())
    before = np.asarray(model.get_layer("patch_embedding").weights[0]).copy()
    assert np.isfinite(model.train_on_batch(IMAGES, np.ones((2, 10), "float32")))
    assert not np.array_equal(np.asarray(model.get_layer("patch_embedding").weights[0]), before)


def test_weights_argument_loads_a_keras_weights_file(tmp_path):
    model = tiny()
    randomize_weights(model, scale=0.2)
    model.save_weights(tmp_path / "w.weights.h5")
    loaded = tiny(weights=str(tmp_path / "w.weights.h5"))
    np.testing.assert_array_equal(np.asarray(loaded(IMAGES)), np.asarray(model(IMAGES)))
    with pytest.raises(ValueError, match="received weights='imagenet'"):
        tiny(weights="imagenet")


def test_pooling_is_ignored_with_the_top_as_in_keras_applications():
    assert tiny(classifier="gap", pooling="token", include_top=True).output_shape == (None, 10)


@pytest.mark.parametrize("kwargs, message", [
    (dict(image_size=(36, 48)), r"divisible by `patch_size`=\(8, 8\); received image_size=\(36, 48\)"),
    (dict(position_embedding="rope"), "position_embedding.*received position_embedding='rope'"),
    (dict(classifier="mean"), "received classifier='mean'"),
    (dict(pooling="mean", include_top=False), "received pooling='mean'"),
    (dict(classifier="gap", pooling="token", include_top=False), "needs a class token"),
    (dict(input_shape=(32, 48)), r"\(height, width, channels\); received input_shape=\(32, 48\)"),
    (dict(input_shape=(None, None, 3)), "needs dynamic_image_size=True"),
    (dict(image_size=(32, 32), input_shape=(32, 48, 3)), "disagree"),
    (dict(dynamic_image_size=True, position_embedding="relative_2d"), "fixed grid"),
    (dict(classes=-1), "received classes=-1"),
    (dict(classes=0, include_top=True), "include_top=True needs a head: the configuration has classes=0"),
    (dict(scan_layers=True, drop_path_rate=1.0),
     r"`drop_path_rate` must be a float in \[0.0, 1\); received drop_path_rate=1.0"),
    (dict(layer_norm_epsilon=float("inf")), r"`layer_norm_epsilon` must be a float in \(0.0, inf\); received .*inf"),
    (dict(input_mean=(float("nan"),) * 3), r"`input_mean` must hold 3 finite floats .*received input_mean=\(nan"),
    (dict(input_std=(float("inf"),) * 3), r"`input_std` must hold 3 finite floats"),
])
def test_bad_arguments_name_expected_and_received(kwargs, message):
    with pytest.raises(ValueError, match=message):
        tiny(**kwargs)


def test_an_unknown_field_is_named():
    with pytest.raises(TypeError, match=r"unknown argument\(s\) \['hidden_sizes'\]"):
        tiny(hidden_sizes=32)


@pytest.mark.parametrize("shape", [(2, 32, 48), (2, 32, 48, 1), (2, 40, 48, 3)])
def test_wrong_input_to_a_built_model(shape):
    # ViTModel's own check names both shapes (more cases in tests/test_wrong_inputs.py).
    expected = re.escape("expects inputs of shape (None, 32, 48, 3)")
    with pytest.raises(ValueError, match=rf"{expected}.*received shape {re.escape(str(shape))}"):
        tiny()(np.zeros(shape, "float32"))


def test_dynamic_model_rejects_a_size_not_divisible_by_the_patch():
    with pytest.raises(ValueError, match="divisible by `patch_size`"):
        tiny(dynamic_image_size=True)(np.zeros((1, 36, 48, 3), "float32"))
