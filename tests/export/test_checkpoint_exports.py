"""Any checkpoint keras_vit reads exports with no architecture flag: the file says what it is."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from export import capi, saved_model

ROOT = pathlib.Path(__file__).parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT)}
CHECKPOINTS = ["token.npz", "gap.npz", "representation.npz", "hybrid.npz", "timm/augreg", "timm/deit",
               "timm/orig_in21k", "timm/gap_fc_norm", "timm/gap_no_token", "timm/no_embed_class", "timm/deit_distilled",
               "timm/bare/weights.safetensors"]


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_every_checkpoint_kind_loads_for_export_with_its_golden_outputs(name):
    path = FIXTURES / name
    io = np.load(FIXTURES / (name.split("/weights")[0].removesuffix(".npz") + "_io.npz"))
    model = keras_vit.load_model(path, classifier_activation=None)
    config = model.vit_config
    inputs = io["images"] if name.endswith(".npz") else keras_vit.preprocess_input(io["images"], config=config)
    expected = io["logits"] if config.classes else io["pre_logits"]
    np.testing.assert_allclose(np.asarray(model(inputs)), expected, atol=1e-4)


def test_a_timm_deit_directory_is_served_with_its_own_normalisation(tmp_path):
    """From the command line to TF's C++ loader: DeiT's ImageNet mean and std reach the signatures."""
    io = np.load(FIXTURES / "timm" / "deit_io.npz")
    result = subprocess.run(
        [sys.executable, "-m", "export", f"--model={FIXTURES / 'timm' / 'deit'}", f"--output={tmp_path}",
         "--name=deit", "--version=1"], cwd=ROOT, capture_output=True, text=True, timeout=300, env=ENV)
    assert result.returncode == 0, result.stderr[-2000:]
    pngs = np.array([tf.io.encode_png(image.astype(np.uint8)).numpy() for image in io["images"]], dtype=object)
    session = capi.SavedModelSession(tmp_path / "deit" / "1")
    try:
        served = session.run("serving_default", images=pngs)
    finally:
        session.close()
    # The images are at the model's 32x32 already, so the served answer is timm's, softmaxed.
    np.testing.assert_allclose(served["probabilities"], tf.nn.softmax(io["logits"]).numpy(), atol=1e-5)


def test_an_official_npz_exports_without_a_variant(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "export", f"--model={FIXTURES / 'gap.npz'}", f"--output={tmp_path}", "--name=gap",
         "--image_size=48"], cwd=ROOT, capture_output=True, text=True, timeout=300, env=ENV)
    assert result.returncode == 0, result.stderr[-2000:]
    metadata = json.loads((tmp_path / "gap" / "1" / "assets.extra" / saved_model.METADATA).read_text())
    assert metadata["preprocessing"]["image_size"] == [48, 48] and metadata["classes"] == 10
    bad = subprocess.run([sys.executable, "-m", "export", f"--model={tmp_path / 'nothing.pt'}",
                          f"--output={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=300, env=ENV)
    assert bad.returncode != 0 and "received" in bad.stderr and "nothing.pt" in bad.stderr
