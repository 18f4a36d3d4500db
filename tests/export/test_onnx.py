"""The ONNX export: checked by ONNX Runtime in a bare process, written whole or not at all, read by ONNX Runtime."""

import collections
import json
import os
import pathlib
import subprocess
import sys
import types

import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from export import onnx as onnx_export
from tests.layer_checks import randomize_weights

ROOT = pathlib.Path(__file__).parents[2]
TINY = dict(patch_size=4, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2, image_size=16, classes=3)
IMAGES = np.random.default_rng(0).uniform(-1, 1, (4, 16, 16, 3)).astype("float32")
# What a deployment writes: ONNX Runtime and numpy, nothing of TensorFlow or keras_vit, any batch.
CLIENT = ("import sys, numpy as np, onnxruntime\n"
          "session = onnxruntime.InferenceSession(sys.argv[1], providers=['CPUExecutionProvider'])\n"
          "images = np.load(sys.argv[2])\n"
          "np.savez(sys.argv[3], one=session.run(['scores'], {'inputs': images[:1]})[0],\n"
          "         three=session.run(['scores'], {'inputs': images[1:4]})[0])\n"
          "assert not any(m.split('.')[0] in ('keras', 'keras_vit', 'tensorflow') for m in sys.modules)\n")


@pytest.fixture(scope="module", params=["softmax", None])
def model(request):
    model = keras_vit.ViT(**TINY, classifier_activation=request.param)
    randomize_weights(model, scale=0.3)
    return model


def test_the_export_is_what_onnx_runtime_alone_reads_at_any_batch(model, tmp_path):
    result = onnx_export.export_onnx(model, tmp_path / "out", IMAGES, labels=["r", "g", "b"], metadata={"source": "x"})
    assert sorted(os.listdir(tmp_path)) == ["out"]
    assert sorted(os.listdir(tmp_path / "out")) == ["labels.txt", "metadata.json", "model.onnx"]
    metadata = json.loads((tmp_path / "out" / "metadata.json").read_text())
    kind = "probabilities" if model.layers[-1].activation.__name__ == "softmax" else "logits"
    assert metadata["format"] == "onnx" and metadata["opset"] == onnx_export.OPSET and metadata["source"] == "x"
    assert metadata["output"]["kind"] == kind and metadata["input"]["shape"] == [None, 16, 16, 3]
    assert metadata["check"] == {key: result[key] for key in ("max_abs_diff_probabilities", "top1_agreement",
                                                               "num_images")} and result["num_images"] == 4
    np.save(tmp_path / "images.npy", IMAGES)
    done = subprocess.run([sys.executable, "-c", CLIENT, result["onnx_path"], tmp_path / "images.npy",
                           tmp_path / "scores.npz"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    expected = np.asarray(model.predict(IMAGES, verbose=0))
    assert np.abs(expected).max() > 0.1  # a head that decides something
    scores = np.load(tmp_path / "scores.npz")
    np.testing.assert_allclose(scores["one"], expected[:1], rtol=0, atol=1e-5)
    np.testing.assert_allclose(scores["three"], expected[1:4], rtol=0, atol=1e-5)


def test_the_file_holds_the_forms_onnx_runtime_fuses(monkeypatch):
    # tf2onnx writes each LayerNorm as ~12 elementwise ops ONNX Runtime's LayerNormFusion misses, and attention's
    # query, key and value as three narrow products; the export rewrites them (standard ONNX ops, no contrib domain).
    import copy

    import onnx
    import tf2onnx.optimizer

    # ...and converts without tf2onnx's copy of the whole graph before each optimizer pass (B/16 grew past 14 GB).
    graph_copies = []

    def deepcopy(x, memo=None):
        graph_copies.extend([type(x).__name__] if isinstance(x, tf2onnx.graph.Graph) else [])
        return copy.deepcopy(x, memo)

    monkeypatch.setattr(tf2onnx.optimizer, "copy", types.SimpleNamespace(deepcopy=deepcopy))
    monkeypatch.delenv("TF2ONNX_CATCH_ERRORS", raising=False)
    model = keras_vit.ViT(**TINY, classifier_activation=None)
    randomize_weights(model, scale=0.3)
    proto = onnx.load_from_string(onnx_export.convert(model))
    assert graph_copies == [] and "TF2ONNX_CATCH_ERRORS" not in os.environ  # and the environment left as it was
    onnx.checker.check_model(proto)
    ops = collections.Counter(node.op_type for node in proto.graph.node)
    assert ops["LayerNormalization"] == 2 * TINY["num_layers"] + 1, ops  # two per block, the final norm
    assert not {"GlobalAveragePool", "ReduceMean", "Sqrt", "Reciprocal", "Neg", "Sub"} & set(ops), ops
    assert ops["Split"] == TINY["num_layers"], ops  # one product per block for query, key and value
    assert {node.domain for node in proto.graph.node} == {""}
    assert [opset.version for opset in proto.opset_import if opset.domain == ""] == [onnx_export.OPSET]


def test_onnx_from_the_command_line(tmp_path):
    model = keras_vit.ViT(**TINY, classifier="gap", classifier_activation=None)
    randomize_weights(model, scale=0.3)
    model.save(tmp_path / "m.keras")
    rng = np.random.default_rng(0)
    for i in range(3):
        (tmp_path / f"img{i}.png").write_bytes(tf.io.encode_png(rng.integers(0, 256, (20, 24, 3), np.uint8)).numpy())
    result = subprocess.run(
        [sys.executable, "-m", "export", f"--model={tmp_path / 'm.keras'}", "--format=onnx",
         f"--images={tmp_path / 'img*.png'}", f"--output={tmp_path / 'onnx'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "ONNX model written to" in result.stdout and "top-1 agreement 100.00%" in result.stdout, result.stdout
    assert "tf2onnx" not in result.stderr, result.stderr  # the converter's INFO lines are not the user's
    metadata = json.loads((tmp_path / "onnx" / "metadata.json").read_text())
    assert metadata["source"] == str(tmp_path / "m.keras") and metadata["image_size"] == [16, 16]
    assert metadata["output"]["kind"] == "logits" and metadata["check"]["num_images"] == 3
