"""The OpenVINO export: checked by OpenVINO's runtime, written whole or not at all, read by OpenVINO alone."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from export import openvino as openvino_export
from tests.layer_checks import randomize_weights

ROOT = pathlib.Path(__file__).parents[2]
TINY = dict(patch_size=4, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2, image_size=16, classes=3)
IMAGES = np.random.default_rng(0).uniform(-1, 1, (4, 16, 16, 3)).astype("float32")
LABELS = ["red", "green", "blue"]


@pytest.fixture(scope="module", params=["softmax", None])
def model(request):
    model = keras_vit.ViT(**TINY, classifier_activation=request.param)
    randomize_weights(model, scale=0.3)
    return model


def test_the_export_is_what_openvino_alone_reads_and_it_answers_as_keras(model, tmp_path):
    result = openvino_export.export_openvino(model, tmp_path / "ir", IMAGES, labels=LABELS, metadata={"source": "x"})
    assert sorted(os.listdir(tmp_path)) == ["ir"] and sorted(os.listdir(tmp_path / "ir")) == [
        "labels.txt", "metadata.json", "model.bin", "model.xml"]
    metadata = json.loads((tmp_path / "ir" / "metadata.json").read_text())
    kind = "probabilities" if model.layers[-1].activation.__name__ == "softmax" else "logits"
    assert metadata["format"] == "openvino" and metadata["source"] == "x" and metadata["output"]["kind"] == kind
    assert metadata["input"]["shape"] == [None, 16, 16, 3] and metadata["check"]["num_images"] == 4
    assert metadata["check"]["top1_agreement"] == 1.0 == result["top1_agreement"]
    assert (tmp_path / "ir" / "labels.txt").read_text() == "red\ngreen\nblue\n"
    # The client: a fresh process with OpenVINO and numpy only, any batch.
    np.save(tmp_path / "images.npy", IMAGES[:3])
    client = ("import sys, numpy as np, openvino\n"
              "model = openvino.Core().compile_model(sys.argv[1], 'CPU', {'INFERENCE_PRECISION_HINT': 'f32'})\n"
              "np.save(sys.argv[3], model(np.load(sys.argv[2]))['scores'])\n"
              "assert not any(m.split('.')[0] in ('keras', 'keras_vit', 'tensorflow') for m in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", client, result["xml_path"], tmp_path / "images.npy",
                           tmp_path / "scores.npy"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    expected = np.asarray(model.predict(IMAGES[:3], verbose=0))
    assert np.abs(expected).max() > 0.1  # a head that decides something
    np.testing.assert_allclose(np.load(tmp_path / "scores.npy"), expected, rtol=0, atol=1e-5)


def test_a_class_token_model_is_converted_trimmed():  # once: the head's activation is not what is trimmed
    converted = openvino_export.convert(keras_vit.ViT(**TINY))
    shapes = [op.get_output_partial_shape(0) for op in converted.get_ordered_ops() if op.get_type_name() == "MatMul"]
    rows = sorted({str(shape[1]) for shape in shapes if shape.rank.get_length() == 3})
    assert rows == ["1", "17"], rows  # the last block's queries are the class token's alone
    gap = keras_vit.ViT(**TINY, classifier="gap")
    shapes = [op.get_output_partial_shape(0) for op in openvino_export.convert(gap).get_ordered_ops()
              if op.get_type_name() == "MatMul" and op.get_output_partial_shape(0).rank.get_length() == 3]
    assert {str(shape[1]) for shape in shapes} == {"16"}  # average pooling reads every token: left whole


def test_what_the_export_cannot_take_is_refused_before_any_work(model, tmp_path):
    (tmp_path / "taken").mkdir()
    headless = keras_vit.ViT(**TINY, include_top=False)
    cases = {
        "must not exist": (model, tmp_path / "taken", IMAGES, {}),
        "no classification head": (headless, tmp_path / "a", IMAGES, {}),
        "verify_images` must be float pixels of shape": (model, tmp_path / "b", IMAGES[:, :8], {}),
        "must be the model's inputs, in \\[-1, 1\\]": (model, tmp_path / "c", IMAGES * 255, {}),
        "The model has 3 classes; received 1 labels": (model, tmp_path / "d", IMAGES, {"labels": ["one"]}),
        "must not set the keys the export writes; received keys \\['check', 'format'\\]": (
            model, tmp_path / "e", IMAGES, {"metadata": {"format": 1, "check": 2}}),
    }
    for message, (m, output, images, kwargs) in cases.items():
        with pytest.raises(ValueError, match=message):
            openvino_export.export_openvino(m, output, images, **kwargs)
    assert os.listdir(tmp_path) == ["taken"] and os.listdir(tmp_path / "taken") == []


def test_openvino_from_the_command_line_on_a_224_pixel_model(tmp_path):
    """Issue 53: a 224 px Ti/16's IR held NaN and garbage weights (a small model's did not): `convert_model` shared
    the traced graph's weight buffers, freed before the IR was saved. Fails without `share_weights=False`. Run with
    oneDNN held to AVX2 (`ONEDNN_MAX_CPU_ISA`), the nearest this machine comes to the CPU that showed it."""
    model = keras_vit.ViT_Ti16(classifier_activation=None)
    randomize_weights(model, scale=0.05)
    model.save(tmp_path / "m.keras")
    rng = np.random.default_rng(0)
    for i in range(3):
        (tmp_path / f"img{i}.png").write_bytes(tf.io.encode_png(rng.integers(0, 256, (240, 250, 3), np.uint8)).numpy())
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "ONEDNN_MAX_CPU_ISA": "AVX2", "TF_ENABLE_ONEDNN_OPTS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "export", f"--model={tmp_path / 'm.keras'}", "--format=openvino",
         f"--images={tmp_path / 'img*.png'}", f"--output={tmp_path / 'ir'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "OpenVINO IR written to" in result.stdout and "top-1 agreement 100.00%" in result.stdout, result.stdout
    metadata = json.loads((tmp_path / "ir" / "metadata.json").read_text())
    assert metadata["source"] == str(tmp_path / "m.keras") and metadata["image_size"] == [224, 224]
    assert metadata["output"]["kind"] == "logits" and metadata["check"]["num_images"] == 3
    assert metadata["check"]["max_abs_diff_probabilities"] <= 1e-5  # a number: NaN fails every comparison
