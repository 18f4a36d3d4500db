"""Few-shot linear evaluation: the closed-form fit, the draws, the refusals, the features and the CLI."""

import json
import os
import pathlib
import subprocess
import sys
import types

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from keras_vit import ViTConfig
from trainers import data, fewshot

ROOT = pathlib.Path(__file__).parents[2]
TINY = ViTConfig(patch_size=2, hidden_size=16, mlp_dim=32, num_heads=2, num_layers=1, image_size=8)


def blobs(num_classes, per_class, width, spread, seed):
    """`per_class` points around each of `num_classes` random centres; features and labels."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(num_classes, width)) * 10.0
    labels = np.repeat(np.arange(num_classes), per_class)
    return centres[labels] + spread * rng.normal(size=(len(labels), width)), labels


def test_separable_classes_are_all_found():
    x, labels = blobs(5, 50, 32, 0.1, seed=0)
    results = fewshot.linear_fewshot(x[::2], labels[::2], x[1::2], labels[1::2], shots=(1, 5), draws=3)
    assert set(results) == {1, 5}
    for result in results.values():
        assert result["draws"] == [1.0, 1.0, 1.0] and result["mean"] == result["min"] == result["max"] == 1.0


def test_random_labels_give_chance():
    rng = np.random.default_rng(1)
    train_x, test_x = rng.normal(size=(400, 16)), rng.normal(size=(400, 16))
    train_y, test_y = rng.integers(0, 4, 400), rng.integers(0, 4, 400)
    results = fewshot.linear_fewshot(train_x, train_y, test_x, test_y, shots=(1, 10, 25), draws=5)
    for result in results.values():
        assert 0.15 < result["mean"] < 0.35  # chance: 0.25
        assert result["min"] <= result["mean"] <= result["max"]


def test_draws_repeat_for_a_seed_and_differ_across_seeds():
    rng = np.random.default_rng(2)
    x, labels = rng.normal(size=(300, 8)), rng.integers(0, 3, 300)
    run = lambda seed, draws: fewshot.linear_fewshot(x, labels, x, labels, (1, 5), draws, seed=seed)  # noqa: E731
    assert run(0, 3) == run(0, 3)
    # Draw d depends on (seed, d) only: more draws extend the list.
    assert run(0, 3)[5]["draws"] == run(0, 5)[5]["draws"][:3]
    assert run(0, 3)[1]["draws"] != run(1, 3)[1]["draws"]


def test_the_fit_is_ridge_regression_on_standardised_features_with_a_bias():
    rng = np.random.default_rng(3)
    labels = np.array([0, 1, 2, 0, 1, 2])
    for x in (rng.normal(size=(6, 20)), rng.normal(size=(6, 3))):  # the (N, N) and the (D, D) system
        standardised = (x - x.mean(0)) / (x.std(0) + 1e-5)
        design = np.concatenate([standardised, np.full((6, 1), 100.0)], axis=1)
        targets = 2.0 * np.eye(3)[labels] - 1.0
        expected = np.linalg.inv(design.T @ design + 7.0 * np.eye(design.shape[1])) @ design.T @ targets
        classifier = fewshot.LinearClassifier.fit(x, labels, 3, l2_reg=7.0)
        np.testing.assert_allclose(classifier.weights, expected, rtol=1e-8, atol=1e-12)
        np.testing.assert_array_equal(classifier.predict(x), np.argmax(design @ expected, axis=1))


def test_a_class_with_too_few_examples_is_named():
    x = np.zeros((14, 4))
    labels = np.array([0] * 6 + [1] * 5 + [2] * 3)
    with pytest.raises(ValueError, match=r"5-shot evaluation needs 5 training examples of every class; class 2 has 3"):
        fewshot.linear_fewshot(x, labels, x, labels, shots=(1, 5))
    with pytest.raises(ValueError, match="class 3 has 0"):
        fewshot.linear_fewshot(x, labels, x, labels, shots=(1,), num_classes=4)


@pytest.mark.parametrize("kwargs, message", [
    ({"shots": (0, 5)}, r"`shots` must be integers >= 1 .*received shots=\[0, 5\]"),
    ({"shots": (1.5,)}, r"received shots=\[1.5\]"),
    ({"shots": ()}, r"received shots=\[\]"),
    ({"shots": (5, 5)}, r"must not repeat a value; received shots=\[5, 5\]"),
    ({"draws": 0}, r"`draws` must be an integer >= 1; received draws=0"),
    ({"l2_reg": 0.0}, r"`l2_reg` must be a finite number > 0; received l2_reg=0.0"),
    ({"l2_reg": float("nan")}, r"received l2_reg=nan"),
])
def test_bad_arguments_are_refused(kwargs, message):
    x, labels = np.zeros((20, 2)), np.arange(20) % 2
    with pytest.raises(ValueError, match=message):
        fewshot.linear_fewshot(x, labels, x, labels, **kwargs)


def test_features_are_the_vector_the_head_reads():
    model = keras_vit.ViT(TINY.replace(representation_size=8), classes=3)
    extractor, layer = fewshot.feature_extractor(model)
    assert layer == "pre_logits"
    images = np.random.default_rng(4).integers(0, 256, (5, 8, 8, 1), dtype=np.uint8)
    dataset = tf.data.Dataset.from_tensor_slices((images, np.arange(5)))
    x, labels = fewshot.features(model, dataset, batch_size=2)
    # Already at the model's size: the pipeline only repeats gray to RGB and scales to [-1, 1].
    rgb = np.repeat(images, 3, axis=-1)
    expected = extractor([keras_vit.preprocess_input(rgb, config=model.vit_config)])
    np.testing.assert_allclose(x, expected, atol=1e-5)
    np.testing.assert_array_equal(labels, np.arange(5))
    assert fewshot.feature_extractor(keras_vit.ViT(TINY, classes=3))[1] == "pooling"
    assert fewshot.feature_extractor(keras_vit.ViT(TINY.replace(fc_norm=True), classes=3))[1] == "fc_norm"
    # A distilled DeiT's features are its two tokens' mean, as without its top.
    deit = keras_vit.ViT(TINY.replace(classifier="token", distilled=True), classes=3)
    headless = keras_vit.ViT(TINY.replace(classifier="token", distilled=True), include_top=False)
    headless.set_weights(deit.get_weights()[:len(headless.weights)])
    extractor, layer = fewshot.feature_extractor(deit)
    inputs = keras_vit.preprocess_input(np.repeat(images, 3, axis=-1), config=deit.vit_config)
    assert layer == "distilled_features"
    np.testing.assert_allclose(extractor([inputs]), headless(inputs), atol=1e-6)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tfds")
    data.load("keras_vit_digits", "train", str(path))  # prepared once for the module
    return str(path)


@pytest.fixture(scope="module")
def tiny_model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "tiny.keras"
    keras.utils.set_random_seed(0)  # its random features, whichever tests built models before in this process
    keras_vit.ViT(TINY, input_shape=(8, 8, 1), classes=10, classifier_activation=None).save(path)
    return path


def flag_values(**changes):
    defaults = dict(model="", dataset="keras_vit_digits", train_split="train", eval_split="test",
                    shots=["1", "5"], draws=2, seed=0, l2_reg=1024.0, crop_fraction=1.0, batch_size=256,
                    data_dir=None, skip_bad_images=False, output=None)
    return types.SimpleNamespace(**{**defaults, **changes})


@pytest.mark.parametrize("changes, message", [
    ({"model": ""}, r"--model is required"),
    ({"model": "/no/such/model.keras"}, r"`model` names no file or directory; received model='/no/such/model.keras'"),
    ({"dataset": "tfrecord:/x/*.rec"}, r"`dataset` must be one of keras_vit_digits, tfds:NAME, folder:PATH"),
    ({"shots": ["1", "five"]}, r"`shots` must be comma-separated integers >= 1; received shots=1,five"),
    ({"shots": ["-1"]}, r"received shots=\[-1\]"),
    ({"draws": 0}, r"received draws=0"),
    ({"seed": -1}, r"`seed` must be an integer >= 0; received seed=-1"),
    ({"crop_fraction": 1.5}, r"`crop_fraction` must be in \(0, 1\]; received crop_fraction=1.5"),
    ({"batch_size": 0}, r"received batch_size=0"),
    ({"output": "/no/such/dir/out.json"}, r"`output` must be a file in an existing directory"),
])
def test_bad_flags_are_named(changes, message, tiny_model_path):
    with pytest.raises(ValueError, match=message):
        fewshot.check_flags(flag_values(**{"model": str(tiny_model_path), **changes}))


def test_more_shots_than_a_class_has_are_refused_before_any_feature(tiny_model_path, data_dir, monkeypatch):
    monkeypatch.setattr(fewshot, "features", lambda *args, **kwargs: pytest.fail("computed features"))
    values = flag_values(model=str(tiny_model_path), data_dir=data_dir, shots=["5", "200"])
    with pytest.raises(ValueError, match=r"200-shot evaluation needs 200 training examples of every class; "
                                         r"class 0 has 136 \(shots=\[5, 200\]\)"):
        fewshot.evaluate(values)


def test_an_evaluation_split_sharing_training_examples_is_refused_before_any_feature(tiny_model_path, data_dir,
                                                                                    monkeypatch):
    monkeypatch.setattr(fewshot, "features", lambda *args, **kwargs: pytest.fail("computed features"))
    values = flag_values(model=str(tiny_model_path), data_dir=data_dir, train_split="train[:90%]",
                         eval_split="train[50%:]")
    with pytest.raises(ValueError, match=r"Splits 'train\[:90%\]' and 'train\[50%:\]' .* share examples"):
        fewshot.evaluate(values)


def test_command_line_prints_the_table_and_writes_json(tiny_model_path, data_dir, tmp_path):
    output = tmp_path / "fewshot.json"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(
        [sys.executable, "-m", "trainers.fewshot", f"--model={tiny_model_path}", "--dataset=keras_vit_digits",
         f"--data_dir={data_dir}", "--shots=1,5", "--draws=2", "--seed=3", f"--output={output}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(output.read_text())
    assert (report["draws"], report["seed"], report["num_classes"]) == (2, 3, 10)
    assert (report["feature_layer"], report["feature_width"]) == ("pooling", 16)
    assert (report["train_examples"], report["eval_examples"]) == (1437, 360)
    assert list(report["results"]) == ["1", "5"]
    lines = result.stdout.splitlines()
    header = lines.index(f"{'shots':>5}  {'mean':>7}  {'min':>7}  {'max':>7}")
    for line, (shots, accuracy) in zip(lines[header + 1:header + 3], report["results"].items(), strict=True):
        assert len(accuracy["draws"]) == 2 and accuracy["min"] <= accuracy["mean"] <= accuracy["max"]
        assert line.split() == [shots, *(f"{100 * accuracy[key]:.2f}%" for key in ("mean", "min", "max"))]
    # Random features of digits still beat chance (0.1) with 5 examples per class.
    assert report["results"]["5"]["mean"] > 0.2
    assert not list(tmp_path.glob("*.tmp-*"))


def test_a_folder_of_images_of_any_size(tmp_path):
    # Class b is bright, class a dark: separable even by a random ViT's features.
    rng = np.random.default_rng(5)
    for split, count in (("train", 3), ("test", 2)):
        for label, low in (("a", 0), ("b", 200)):
            folder = tmp_path / "images" / split / label
            folder.mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(low, low + 56, (10 + 3 * i, 14, 3), dtype=np.uint8)
                (folder / f"{i}.png").write_bytes(tf.io.encode_png(pixels).numpy())
    model_path = tmp_path / "rgb.keras"
    keras_vit.ViT(TINY, classes=2).save(model_path)
    values = flag_values(model=str(model_path), dataset=f"folder:{tmp_path / 'images'}", shots=["1", "3"])
    report = fewshot.evaluate(values)
    assert (report["num_classes"], report["train_examples"], report["eval_examples"]) == (2, 6, 4)
    assert report["results"]["3"]["draws"] == [1.0, 1.0]
