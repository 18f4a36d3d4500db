"""The blocks of the later families through the four exports: each exporter's own check (SavedModel loaded by
TensorFlow's C API, TFLite by LiteRT with builtin ops only, OpenVINO's IR by its runtime, ONNX by ONNX Runtime)
passes, and the served answers are Keras'."""

import numpy as np
import pytest

import keras_vit
from export import onnx, openvino, saved_model, tflite
from tests.export.test_serving_matrix import check_served
from tests.layer_checks import randomize_weights

TINY = dict(patch_size=8, hidden_size=32, mlp_dim=48, num_heads=2, num_layers=2, image_size=16, classes=3,
            classifier_activation=None)
CASES = {  # DINOv2 (giant) with registers and its classifier; AIMv2's blocks; CLIP's with a projection
    "dinov2": dict(layer_scale_init=0.5, gated_mlp=True, activation="silu", num_register_tokens=2,
                   classifier="token_and_gap"),
    "aimv2_qk_norm": dict(norm_layer="rms_norm", patch_norm=True, qk_norm=True, qkv_bias="none", class_token=False,
                          classifier="gap", gated_mlp=True, activation="silu", layer_norm_epsilon=1e-5),
    "clip": dict(norm_pre=True, patch_bias=False, activation="quick_gelu", projection_dim=8, fc_norm=True,
                 layer_norm_epsilon=1e-5),
    # Rotary positions (issue 51): EVA02's beside a table, with its norms; DINOv3's on a run-time grid; RoPE-Mixed's
    # learned frequencies, turned in the graph.
    "eva02_rope": dict(rotary_embedding="rope_eva", rope_reference_grid=16, attention_norm=True, mlp_norm=True,
                       gated_mlp=True, activation="silu", qkv_bias="qv"),
    "dinov3_rope": dict(rotary_embedding="rope_dinov3", position_embedding="none", dynamic_image_size=True,
                        num_register_tokens=2, layer_scale_init=0.5, qkv_bias="none", classifier="gap"),
    "mixed_rope": dict(rotary_embedding="rope_mixed", position_embedding="none", layer_scale_init=0.5),
}
IMAGES = np.random.default_rng(2).uniform(-1, 1, (4, 16, 16, 3)).astype("float32")


@pytest.fixture(scope="module", params=list(CASES))
def model(request):
    model = keras_vit.ViT(**TINY, **CASES[request.param])
    randomize_weights(model, scale=0.3)
    return model


@pytest.mark.slow
def test_each_family_is_served_as_keras_computes_it(model, tmp_path):
    path = saved_model.export_saved_model(model, tmp_path, name="vit")
    check_served(model, path, 16)


def fixed(model):
    """The model at its configured size, for the exports that take one (a run-time grid's model: its twin)."""
    if not model.vit_config.dynamic_image_size:
        return model
    twin = keras_vit.ViT(model.vit_config.replace(dynamic_image_size=False), classifier_activation=None)
    twin.set_weights(model.get_weights())
    return twin


@pytest.mark.slow
def test_each_family_converts_to_builtin_tflite_and_answers_as_keras(model):
    model = fixed(model)
    converted = tflite.convert(model)
    assert not tflite.non_builtin_ops(converted)
    np.testing.assert_allclose(tflite.run(converted, IMAGES), np.asarray(model.predict(IMAGES, verbose=0)),
                               atol=1e-5)


@pytest.mark.slow
def test_each_family_exports_to_openvino_within_its_check(model, tmp_path):
    result = openvino.export_openvino(fixed(model), tmp_path / "ir", IMAGES)
    assert result["top1_agreement"] == 1.0 and result["max_abs_diff_probabilities"] <= 1e-5


@pytest.mark.slow
def test_each_family_exports_to_onnx_within_its_check(model, tmp_path):
    result = onnx.export_onnx(fixed(model), tmp_path / "onnx", IMAGES)
    assert result["top1_agreement"] == 1.0 and result["max_abs_diff_probabilities"] <= 1e-5
