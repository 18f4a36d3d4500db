"""`python -m keras_vit.explain` writes every figure for a model and an image, and refuses bad input by name."""

import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from tests.layer_checks import randomize_weights

ROOT = pathlib.Path(__file__).parents[1]
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def explain(*args):
    return subprocess.run([sys.executable, "-m", "keras_vit.explain", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=ENV)


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
    from keras_vit.explain import check_paths, class_names

    (tmp_path / "text.png").write_text("not an image")
    model = keras_vit.ViT(patch_size=4, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1, image_size=16,
                          classes=3)
    model.save(tmp_path / "m.keras")
    # On the command line: a refusal is a usage error, named on stderr.
    bad = explain(f"--model={tmp_path / 'm.keras'}", f"--image={tmp_path / 'text.png'}")
    assert bad.returncode != 0 and "text.png' is not a JPEG, PNG, GIF, BMP or WebP image" in bad.stderr
    # The other refusals, in-process (each command line would pay TensorFlow's import: CI time).
    (tmp_path / "two.txt").write_text("a\nb\n")
    (tmp_path / "a_file").write_text("")
    for arguments, message in (
            (("m.keras", None, None, None), "--image is required"),
            (("m.keras", f"{tmp_path}/none.png", None, None), f"--image='{tmp_path}/none.png': no such file"),
            (("m.keras", str(image), f"{tmp_path}/none.txt", None), f"--labels='{tmp_path}/none.txt': no such file"),
            (("m.keras", str(image), None, f"{tmp_path}/a_file"), "--output must be a directory")):
        with pytest.raises(ValueError, match=re.escape(message)):
            check_paths(*arguments)
    assert check_paths("m.keras", str(image), None, None) == pathlib.Path("explain_photo")
    with pytest.raises(ValueError, match="has 2 names; the model has 3 classes"):
        class_names(model, tmp_path / "two.txt")


def _encoded(kind, pixels, **options):
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels[0]).save(buffer, format=kind, **options, **(
        dict(save_all=True, append_images=[Image.fromarray(p) for p in pixels[1:]]) if len(pixels) > 1 else {}))
    return buffer.getvalue()


def test_every_still_format_reads_as_the_models_channels_and_an_animated_webp_is_refused(tmp_path):
    """As the trainer and the export decode (`keras_vit.image_formats`): alpha dropped, grey made from colour."""
    from keras_vit import explain

    rgba = np.random.default_rng(0).integers(0, 256, (1, 12, 16, 4), dtype=np.uint8)
    rgba[..., 3] = 200
    rgb = np.ascontiguousarray(rgba[..., :3])
    for kind, pixels, options in (("WEBP", rgba, dict(lossless=True)), ("PNG", rgba, {}), ("GIF", rgb[..., :1], {}),
                                  ("BMP", rgb, {})):
        path = tmp_path / f"image.{kind.lower()}"
        path.write_bytes(_encoded(kind, pixels if kind != "GIF" else np.repeat(pixels, 3, -1), **options))
        png_grey = tf.io.decode_png(path.read_bytes(), channels=1).numpy() if kind == "PNG" else None  # libpng's
        for channels in (3, 1):
            config = keras_vit.ViTConfig(patch_size=4, image_size=(12, 16), channels=channels,
                                         input_mean=(0.5,) * channels, input_std=(0.5,) * channels)
            shown, _ = explain.read_image(path, config, crop_fraction=1.0)
            colour = np.repeat(pixels, 3, -1)[0] if kind == "GIF" else pixels[0, ..., :3]
            expected = colour if channels == 3 else png_grey if kind == "PNG" else np.round(
                tf.image.rgb_to_grayscale(colour.astype(np.float32)).numpy()).astype(np.uint8)
            np.testing.assert_array_equal(shown, expected, err_msg=f"{kind}, {channels} channels")
    path = tmp_path / "moving.webp"
    path.write_bytes(_encoded("WEBP", np.concatenate([rgba, 255 - rgba]), duration=100))
    with pytest.raises(ValueError, match=r"moving.webp' is an animated WebP"):
        explain.read_image(str(path), keras_vit.ViTConfig(patch_size=4, image_size=(12, 16)), crop_fraction=1.0)


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

