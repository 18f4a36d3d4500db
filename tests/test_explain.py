"""`python -m keras_vit.explain` writes every figure for a model and an image, and refuses bad input by name."""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from tests.layer_checks import randomize_weights
from tests.processes import run_together

ROOT = pathlib.Path(__file__).parents[1]
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def explain(*args):
    return subprocess.run([sys.executable, "-m", "keras_vit.explain", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=ENV)


def explain_together(*commands):
    """`explain(*args)` for each argument list, the processes started together."""
    return run_together([[sys.executable, "-m", "keras_vit.explain", *args] for args in commands], timeout=300,
                        cwd=ROOT, env=ENV)


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    path = tmp_path_factory.mktemp("image") / "photo.png"
    pixels = np.random.default_rng(0).integers(0, 256, (40, 30, 3), dtype=np.uint8)
    path.write_bytes(tf.io.encode_png(pixels).numpy())
    return path


@pytest.mark.parametrize("fields, figures", [
    (dict(classifier="token", position_embedding="learned_2d"),
     ["rollout.png", "attention_distance.png", "position_similarity.png", "embedding_filters.png"]),
    (dict(classifier="gap", position_embedding="sincos_2d"),
     ["rollout.png", "attention_distance.png", "embedding_filters.png"]),
])
def test_every_figure_is_written(tmp_path, image, fields, figures):
    model = keras_vit.ViT(patch_size=4, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2, image_size=(16, 24),
                          classes=3, classifier_activation=None, **fields)
    randomize_weights(model, scale=0.2)
    model.save(tmp_path / "m.keras")
    (tmp_path / "labels.txt").write_text("cat\ndog\nbird\n")
    result = explain(f"--model={tmp_path / 'm.keras'}", f"--image={image}", f"--output={tmp_path / 'out'}",
                     f"--labels={tmp_path / 'labels.txt'}")
    assert result.returncode == 0, result.stderr[-2000:]
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert written == sorted(figures)
    for name in figures:
        data = (tmp_path / "out" / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000, name
        assert f"{tmp_path / 'out' / name}:" in result.stdout
    if "position_similarity.png" not in figures:
        assert "has no learned table to compare" in result.stdout


def test_bad_input_is_named(tmp_path, image):
    (tmp_path / "text.png").write_text("not an image")
    model = keras_vit.ViT(patch_size=4, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1, image_size=16,
                          classes=3)
    model.save(tmp_path / "m.keras")
    (tmp_path / "two.txt").write_text("a\nb\n")
    (tmp_path / "a_file").write_text("")
    missing, bad, labels, output = explain_together(
        ["--model=whatever.keras", f"--image={tmp_path / 'none.png'}"],
        [f"--model={tmp_path / 'm.keras'}", f"--image={tmp_path / 'text.png'}"],
        [f"--model={tmp_path / 'm.keras'}", f"--image={image}", f"--labels={tmp_path / 'two.txt'}",
         f"--output={tmp_path / 'out'}"],
        ["--model=whatever.keras", f"--image={image}", f"--output={tmp_path / 'a_file'}"])
    assert output.returncode != 0 and "--output must be a directory" in output.stderr, output.stderr[-1000:]
    assert missing.returncode != 0 and "--image=" in missing.stderr and "no such file" in missing.stderr
    assert bad.returncode != 0 and "is not a JPEG, PNG, GIF or BMP image" in bad.stderr
    assert labels.returncode != 0 and "has 2 names; the model has 3 classes" in labels.stderr


def test_top5_of_a_distilled_softmax_model_is_its_own_probabilities():
    from keras_vit import explain

    model = keras_vit.ViT(patch_size=4, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1, image_size=16,
                          classes=6, distilled=True)
    for head in ("head", "head_dist"):  # spread probabilities, which a second softmax would flatten
        model.get_layer(head).bias.assign(np.linspace(-3, 3, 6).astype("float32"))
    inputs = np.random.default_rng(0).uniform(-1, 1, (1, 16, 16, 3)).astype("float32")
    expected = np.sort(np.asarray(model(inputs))[0])[::-1][:5]
    np.testing.assert_allclose([p for _, p in explain.top5(model, inputs, [str(i) for i in range(6)])], expected,
                               rtol=1e-5)

