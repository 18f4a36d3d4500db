"""The export command line, TFLite path: real image files in, a checked model out."""

import dataclasses
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import tensorflow as tf

import keras_vit
from tests.layer_checks import randomize_weights
from tests.processes import run_together, unreachable_network

ROOT = pathlib.Path(__file__).parents[2]


def test_tflite_from_the_command_line(tmp_path):
    model = keras_vit.ViT(patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1, image_size=16,
                          classes=3, classifier_activation=None)
    randomize_weights(model, scale=0.3)
    model.save(tmp_path / "m.keras")
    rng = np.random.default_rng(0)
    for i in range(6):
        pixels = rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)
        (tmp_path / f"img{i}.png").write_bytes(tf.io.encode_png(pixels).numpy())
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run(
        [sys.executable, "-m", "export", f"--model={tmp_path / 'm.keras'}", "--format=tflite", "--quantize=float16",
         f"--images={tmp_path / 'img*.png'}", f"--output={tmp_path / 'out'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "out" / "model_float16.tflite").exists() and "float16" in result.stdout
    metadata = json.loads((tmp_path / "out" / "metadata.json").read_text())
    assert metadata["quantize"] == "float16" and metadata["image_size"] == [16, 16]
    # Full int8 calibrated on other images than it is checked on (forced: a random model, six images).
    result = subprocess.run(
        [sys.executable, "-m", "export", f"--model={tmp_path / 'm.keras'}", "--format=tflite", "--quantize=int8",
         f"--images={tmp_path / 'img[0-3].png'}", f"--calibration_images={tmp_path / 'img[45].png'}", "--force",
         f"--output={tmp_path / 'int8'}"], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    metadata = json.loads((tmp_path / "int8" / "metadata.json").read_text())
    assert metadata["num_images"] == 4 and metadata["num_calibration_images"] == 2
    assert "top-1 agree" in result.stdout and 0 <= metadata["top1_agreement"] <= 1
    missing = subprocess.run([sys.executable, "-m", "export", f"--model={tmp_path / 'm.keras'}", "--format=tflite",
                              f"--output={tmp_path / 'out2'}"], cwd=ROOT, capture_output=True, text=True,
                             timeout=300, env=env)
    assert missing.returncode != 0 and "pass --images=GLOB" in missing.stderr


def test_a_missed_tolerance_is_an_error_not_a_usage_text(tmp_path):
    # The flags are right and the model misses its bound (here made to, in a process of its own):
    # the command exits 1 naming what missed and --force, without absl's usage text.
    model = keras_vit.ViT(patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1, image_size=16,
                          classes=3, classifier_activation=None)
    model.save(tmp_path / "m.keras")
    (tmp_path / "img.png").write_bytes(tf.io.encode_png(np.zeros((16, 16, 3), np.uint8)).numpy())
    script = (  # `python -m export ...`, with the bound patched first
        "import runpy, sys; from export import tflite\n"
        "tflite.TOLERANCES['none'] = dict(max_abs=-1.0, agreement=1.0)\n"
        f"sys.argv = ['export', '--model={tmp_path / 'm.keras'}', '--format=tflite', "
        f"'--images={tmp_path / 'img.png'}', '--output={tmp_path / 'out'}']\n"
        "runpy.run_module('export', run_name='__main__', alter_sys=True)\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-2000:]
    assert "not within its tolerance" in result.stderr and "--force" in result.stderr
    assert "flags:" not in output and "USAGE" not in output  # absl's usage text
    assert not (tmp_path / "out").exists()


def test_every_flag_is_checked_before_the_model_loads(tmp_path):
    # --model names no file: each refusal below must come from the flags, before any loading.
    (tmp_path / "img.png").write_bytes(tf.io.encode_png(np.zeros((16, 16, 3), np.uint8)).numpy())
    (tmp_path / "taken" / "vit" / "2").mkdir(parents=True)
    (tmp_path / "taken" / "vit" / "0").mkdir()  # TF Serving's version 0: a version, checked like any other
    (tmp_path / "latin1.txt").write_bytes("chat\ncaf\xe9\n".encode("latin-1"))
    keras_model = tmp_path / "m.keras"
    keras_vit.ViT(patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1, image_size=16,
                  classes=2).save(keras_model)
    missing = f"--model={tmp_path / 'missing.keras'}"
    tflite_base = [missing, "--format=tflite", f"--images={tmp_path / 'img.png'}", f"--output={tmp_path / 'new'}"]
    cases = {
        "--quantize apply to --format=tflite only; received --format=saved_model": [
            missing, f"--output={tmp_path / 's'}", "--quantize=int8"],
        "--version, --top_k apply to --format=saved_model only; received --format=tflite": [
            *tflite_base, "--top_k=2", "--version=3"],
        "--name must be one directory name": [missing, f"--output={tmp_path / 's'}", "--name="],
        "matches no file": [missing, "--format=tflite", f"--images={tmp_path / 'none*.png'}", "--output=x"],
        "no*.png' matches no file": [*tflite_base, "--quantize=int8", f"--calibration_images={tmp_path / 'no*.png'}"],
        "--calibration_images applies to --quantize=int8 only": [*tflite_base, "--calibration_images=x"],
        "exists: --format=tflite writes a new directory": [*tflite_base[:3], f"--output={tmp_path}"],
        "--format=openvino checks the model on real images: pass --images=GLOB": [
            missing, "--format=openvino", f"--output={tmp_path / 'o'}"],
        "--quantize apply to --format=tflite only; received --format=openvino": [
            missing, "--format=openvino", *tflite_base[2:], "--quantize=int8"],
        "--images apply to --format=tflite, openvino, onnx only; received --format=saved_model": [
            missing, f"--output={tmp_path / 's'}", tflite_base[2]],
        "exists: --format=openvino writes a new directory": [
            missing, "--format=openvino", tflite_base[2], f"--output={tmp_path}"],
        "--version=2 exists at": [missing, f"--output={tmp_path / 'taken'}", "--version=2"],
        "--version=0 exists at": [missing, f"--output={tmp_path / 'taken'}", "--version=0"],
        "--version must be an integer >= 0": [missing, f"--output={tmp_path / 's'}", "--version=-1"],
        "missing.keras', which does not exist": [missing, f"--output={tmp_path / 's'}"],
        "must be UTF-8 text": [f"--model={keras_model}", f"--output={tmp_path / 's'}",
                               f"--labels={tmp_path / 'latin1.txt'}"],
        "is not an export": [f"--inspect={tmp_path / 'taken' / 'vit'}"],
    }
    # And before TensorFlow is imported: here any import of it fails.
    (tmp_path / "poisoned" / "tensorflow").mkdir(parents=True)
    (tmp_path / "poisoned" / "tensorflow" / "__init__.py").write_text("raise ImportError('TensorFlow imported')")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "poisoned"), str(ROOT)])}
    results = run_together([[sys.executable, "-m", "export", *args] for args in cases.values()], cwd=ROOT,
                           env=env, timeout=300)
    for message, result in zip(cases, results, strict=True):
        assert result.returncode == 1 and message in result.stderr, (message, result.stderr[-1500:])
        assert "Traceback" not in result.stderr, result.stderr[-1500:]
        # The reason in one line, then where the flags are listed: not absl's page of every flag.
        assert len(result.stderr.strip().splitlines()) <= 3 and "--helpfull" in result.stderr, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["img.png", "latin1.txt", "m.keras", "poisoned", "taken"]


def test_weights_out_of_reach_are_refused_in_three_lines_without_a_traceback(tmp_path):
    # Offline (a proxy nobody listens on, the URLs real): a released file's URL and a hub id neither is cached.
    bucket = keras_vit.checkpoints.pretrained.BUCKET + "imagenet21k/ViT-B_16.npz"
    env = unreachable_network({**os.environ, "KERAS_HOME": str(tmp_path / "home"),
                               "HF_HUB_CACHE": str(tmp_path / "hf"), "TF_CPP_MIN_LOG_LEVEL": "3"})
    named, hub = run_together([[sys.executable, "-m", "export", f"--model={model}", f"--output={tmp_path / 'out'}"]
                               for model in (bucket, "testorg/not-cached")], cwd=ROOT, env=env, timeout=300)
    for result, first, cache in (
            (named, f"export: Could not download ViT-B/16:imagenet21k from {bucket} (",
             f"put it at {tmp_path / 'home' / 'vit_models' / 'imagenet21k' / 'ViT-B_16.npz'}, where keras_vit"),
            (hub, "export: Could not download the Hugging Face hub id 'testorg/not-cached' from "
                  "https://huggingface.co/testorg/not-cached (", f"fills into {tmp_path / 'hf'}, where keras_vit")):
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
        assert len(lines) <= 3 and lines[0].startswith(first) and cache in lines[1], result.stderr
        assert "Connection refused" in lines[0] and "--model=PATH to the exporter" in lines[2], result.stderr
    assert not (tmp_path / "out").exists()


def test_a_missing_export_extra_is_one_line_naming_the_install(monkeypatch):
    from export import choices

    assert all(choices.missing_message(f) is None for f in choices.FORMATS)
    monkeypatch.setitem(choices.FORMATS, "tflite", dataclasses.replace(
        choices.FORMATS["tflite"], needs=(("keras_vit_no_such_module", "ai-edge-litert"),)))
    message = choices.missing_message("tflite")
    assert "\n" not in message and "ai-edge-litert" in message and "pip install -e '.[export]'" in message
