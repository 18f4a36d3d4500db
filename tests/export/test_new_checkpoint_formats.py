"""Export and fine-tuning from each checkpoint kind of issue 41: transformers, big_vision, timm registers / MAP.

The exporter reads them through `keras_vit.load_model` (the file says what it
is); the trainer's model builder loads them as a fine-tuning start.
"""

import json
import os
import pathlib
import sys
import types

import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from export import capi, saved_model
from tests.processes import run_together

ROOT = pathlib.Path(__file__).parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT)}
# checkpoint, its io file, the io key of the expected outputs
KINDS = {
    "hf/vit_classifier": ("hf/vit_classifier_io.npz", "outputs"),
    "hf/deit_teacher": ("hf/deit_teacher_io.npz", "outputs"),
    "timm_extra/bv_map.npz": ("timm_extra/bv_map_io.npz", "logits"),
    "timm_extra/map_reg": ("timm_extra/map_reg_io.npz", "logits"),
    "timm_extra/reg4_gap": ("timm_extra/reg4_gap_io.npz", "logits"),
}


@pytest.mark.parametrize("name", sorted(KINDS))
def test_each_kind_loads_for_export_and_normalises_its_own_way(name):
    io_name, key = KINDS[name]
    io = np.load(FIXTURES / io_name)
    model = keras_vit.load_model(FIXTURES / name, classifier_activation=None)
    # The pixels through the checkpoint's own mean and std (carried in its ViTConfig) give the reference's logits.
    inputs = keras_vit.preprocess_input(io["images"], config=model.vit_config)
    np.testing.assert_allclose(np.asarray(inputs), io["inputs"], atol=1e-5)
    np.testing.assert_allclose(np.asarray(model(inputs)), io[key], atol=1e-4)


def _served(version, images):
    pngs = np.array([tf.io.encode_png(image.astype(np.uint8)).numpy() for image in images], dtype=object)
    session = capi.SavedModelSession(version)
    try:
        return session.run("serving_default", images=pngs)
    finally:
        session.close()


@pytest.mark.slow
def test_transformers_and_big_vision_files_are_served_from_the_command_line(tmp_path):
    """From `python -m export --model=...` to TF's C++ loader: each file's normalisation reaches the signature."""
    cases = {"hf": ("hf/vit_classifier", "hf/vit_classifier_io.npz", "outputs"),
             "bv": ("timm_extra/bv_map.npz", "timm_extra/bv_map_io.npz", "logits")}
    results = run_together([[sys.executable, "-m", "export", f"--model={FIXTURES / model}", f"--output={tmp_path}",
                             f"--name={name}", "--version=1"] for name, (model, _, _) in cases.items()],
                           cwd=ROOT, env=ENV, timeout=600)
    for name, result in zip(cases, results, strict=True):
        assert result.returncode == 0, (name, result.stderr[-2000:])
        _, io_name, key = cases[name]
        io = np.load(FIXTURES / io_name)
        served = _served(tmp_path / name / "1", io["images"])
        # The images are at the model's 32x32 already, so the served answer is the reference's, softmaxed.
        np.testing.assert_allclose(served["probabilities"], tf.nn.softmax(io[key]).numpy(), atol=1e-5)
    metadata = json.loads((tmp_path / "hf" / "1" / "assets.extra" / saved_model.METADATA).read_text())
    assert metadata["preprocessing"]["mean"] == pytest.approx([0.4, 0.5, 0.6])
    # The directory's id2label becomes the export's labels, in class order.
    io = np.load(FIXTURES / "hf" / "vit_classifier_io.npz")
    served = _served(tmp_path / "hf" / "1", io["images"])
    best = [label.decode() for label in served["top_k_labels"][:, 0]]
    names = ["cat", "dog", "bird", "fish", "frog"]
    assert best == [names[i] for i in io["outputs"].argmax(axis=1)]


@pytest.mark.parametrize("name", ["hf/vit_classifier", "timm_extra/bv_map.npz", "timm_extra/reg4_gap",
                                  # The later families (issue 50): LayerScale, CLIP's projection, AIMv2's blocks.
                                  "families/timm_dinov2", "families/hf_clip_projection", "families/timm_aimv2"])
def test_the_trainer_fine_tunes_from_each_kind(name):
    from trainers import loop, recipes

    path = str(FIXTURES / name)
    config = keras_vit.config_from_checkpoint(path)
    recipe = recipes.validate(recipes.RECIPES["vit_finetune"].replace(
        **config.to_dict(), pretrained=path, dataset="keras_vit_digits", train_split="train", eval_split="test"))
    model = loop.build_model(recipe, types.SimpleNamespace(channels=3, num_classes=7))
    source = keras_vit.ViT.from_checkpoint(path)
    assert model.output_shape == (None, 7) and not model.get_layer("head").kernel.numpy().any()  # a new head
    for layer in ("patch_embedding", "encoder_block_0", "fc_norm" if config.fc_norm else "encoder_norm"):
        for ours, theirs in zip(model.get_layer(layer).weights, source.get_layer(layer).weights, strict=True):
            np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    images = np.random.default_rng(0).normal(size=(4, 32, 32, 3)).astype("float32")
    history = model.fit(images, np.arange(4) % 7, epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
