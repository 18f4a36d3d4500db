"""transformers' DINOv2, CLIP and SigLIP image towers: read with transformers' own outputs, at 32 and 48 px.

The fixtures in tests/fixtures/families/hf_* were written by transformers
5.24 itself (`make_family_fixtures.py`: `save_pretrained` of tiny random
models, with their outputs at the file's 32 px and, resizing the position
table as transformers does, at 48 px); keras_vit reads them without torch.
"""

import json
import os
import shutil

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import checkpoints
from keras_vit.checkpoints.safetensors import read_safetensors, write_safetensors

FAMILIES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "families")
ATOL = 1e-5  # float32 against transformers' float32 (seen: under 1.5e-6 everywhere)
SIZES = (32, 48)
# case: (the model's output in the io file, the ViTConfig fields the file must give)
CASES = {
    "hf_dinov2": ("pooler_output", dict(
        classifier="token", classes=0, layer_scale_init=1.0, gated_mlp=False, activation="gelu",
        gelu_approximate=False, layer_norm_epsilon=1e-6, interpolation="bicubic_no_antialias",
        input_mean=(0.485, 0.456, 0.406))),
    "hf_dinov2_classifier": ("logits", dict(
        classifier="token_and_gap", classes=5, layer_scale_init=1.0, interpolation="bicubic_no_antialias")),
    "hf_dinov2_swiglu": ("pooler_output", dict(
        gated_mlp=True, activation="silu", mlp_dim=88, layer_scale_init=1.0, interpolation="bicubic_no_antialias")),
    "hf_dinov2_registers": ("pooler_output", dict(
        num_register_tokens=4, no_embed_class=True, class_token=True, interpolation="bicubic")),
    "hf_clip_vision": ("pooler_output", dict(
        classifier="token", norm_pre=True, patch_bias=False, fc_norm=True, projection_dim=None,
        activation="quick_gelu", layer_norm_epsilon=1e-5, interpolation="bicubic_no_antialias",
        input_mean=(0.48145466, 0.4578275, 0.40821073))),
    "hf_clip_projection": ("image_embeds", dict(
        fc_norm=True, norm_pre=True, projection_dim=24, interpolation="bicubic_no_antialias")),
    "hf_siglip_vision": ("pooler_output", dict(
        classifier="map", class_token=False, patch_bias=True, norm_pre=False, activation="gelu",
        gelu_approximate=True, layer_norm_epsilon=1e-6, interpolation="bicubic_no_antialias",
        input_mean=(0.5, 0.5, 0.5))),
}


def _io(case):
    with np.load(os.path.join(FAMILIES, f"{case}_io.npz")) as io:
        return {key: io[key] for key in io.files}


def _sequence_layer(config):
    """The layer whose output is transformers' last_hidden_state: CLIP's is before post_layernorm (fc_norm)."""
    return f"encoder_block_{config.num_layers - 1}" if config.fc_norm else "encoder_norm"


def _outputs(directory, size, inputs, **overrides):
    """(config, model output, sequence) of `directory` read at `size` px."""
    model = keras_vit.ViT.from_checkpoint(directory, classifier_activation=None, image_size=size, **overrides)
    both = keras.Model(model.input, [model.outputs[0], model.get_layer(_sequence_layer(model.vit_config)).output])
    output, sequence = (np.asarray(x) for x in both(inputs))
    return model.vit_config, output, sequence


@pytest.fixture(scope="module")
def read():
    """{(case, size): (config, output, sequence)}: each model built and run once for the module."""
    out = {}
    for case in CASES:
        io = _io(case)
        for size in SIZES:
            out[case, size] = _outputs(os.path.join(FAMILIES, case), size, io["inputs" if size == 32 else "inputs_48"])
    return out


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_families_give_transformers_outputs(read, case, size):
    key, fields = CASES[case]
    config, output, sequence = read[case, size]
    suffix = "" if size == 32 else "_48"
    io = _io(case)
    np.testing.assert_allclose(output, io[key + suffix], atol=ATOL)
    np.testing.assert_allclose(sequence, io["last_hidden_state" + suffix], atol=ATOL)
    assert {name: getattr(config, name) for name in fields} == fields
    assert config.image_size == (size, size)


def test_the_position_tables_are_transformers_resized_ones():
    # The table transformers used at 48 px: Dinov2WithRegisters' antialiased, the others' not (about 0.15 apart).
    for case in ("hf_dinov2", "hf_dinov2_registers", "hf_clip_vision", "hf_siglip_vision"):
        model = keras_vit.ViT.from_checkpoint(os.path.join(FAMILIES, case), image_size=48)
        table = np.asarray(model.get_layer("position_embedding").weights[0])
        expected = _io(case)["pos_embed_48"]
        if case == "hf_dinov2_registers":  # the class row lives in the class token: cls + pos[0]
            tensors = read_safetensors(os.path.join(FAMILIES, case, "model.safetensors"))
            folded = tensors["embeddings.cls_token"] + tensors["embeddings.position_embeddings"][:, :1]
            np.testing.assert_allclose(np.asarray(model.get_layer("class_token").weights[0]), folded, atol=1e-7)
            expected = expected[:, 1:]
        np.testing.assert_allclose(table, expected, atol=ATOL)


def _copy(tmp_path, case, name=None):
    target = tmp_path / (name or case)
    shutil.copytree(os.path.join(FAMILIES, case), target)
    return target


def _config(directory):
    with open(directory / "config.json") as f:
        return json.load(f)


def _write_config(directory, cfg):
    with open(directory / "config.json", "w") as f:
        json.dump(cfg, f)


def _edit_config(directory, **changes):
    _write_config(directory, {**_config(directory), **changes})


def _tensors(directory):
    return read_safetensors(directory / "model.safetensors")


def _write_tensors(directory, tensors):
    write_safetensors(directory / "model.safetensors", tensors)


def _check(directory, case, size=32):
    io = _io(case)
    _, output, sequence = _outputs(directory, size, io["inputs" if size == 32 else "inputs_48"])
    suffix = "" if size == 32 else "_48"
    np.testing.assert_allclose(output, io[CASES[case][0] + suffix], atol=ATOL)
    np.testing.assert_allclose(sequence, io["last_hidden_state" + suffix], atol=ATOL)


def test_image_towers_are_read_with_and_without_the_vision_model_prefix(tmp_path):
    # transformers 5 writes CLIPVisionModel and SiglipVisionModel without `vision_model.`; older versions (and the
    # hub's files) with it, as CLIPVisionModelWithProjection still is.
    for case in ("hf_clip_vision", "hf_siglip_vision"):
        directory = _copy(tmp_path, case)
        _write_tensors(directory, {f"vision_model.{name}": value for name, value in _tensors(directory).items()})
        _check(directory, case)
    directory = _copy(tmp_path, "hf_clip_projection")
    tensors = _tensors(directory)
    _write_tensors(directory, {name.removeprefix("vision_model."): value for name, value in tensors.items()})
    _check(directory, "hf_clip_projection")


@pytest.mark.parametrize("case", ["hf_clip_vision", "hf_dinov2", "hf_clip_projection"])
def test_a_lone_transformers_file_asks_for_its_folder(tmp_path, case):
    lone = tmp_path / "model.safetensors"
    shutil.copy(os.path.join(FAMILIES, case, "model.safetensors"), lone)
    with pytest.raises(ValueError, match=r"holds transformers tensors .* expected its folder, with the config\.json"):
        keras_vit.ViT.from_checkpoint(lone)


def test_an_older_clip_file_with_its_int64_position_ids_is_read(tmp_path):
    """Hub files of older transformers keep `embeddings.position_ids` (I64) beside the table: passed over."""
    directory = _copy(tmp_path, "hf_clip_projection")
    tensors = _tensors(directory)
    tensors["vision_model.embeddings.position_ids"] = np.arange(17, dtype=np.int64)[None]
    _write_tensors(directory, tensors)
    assert _tensors(directory)["vision_model.embeddings.position_ids"].dtype == np.int64
    _check(directory, "hf_clip_projection")


def _full_model(tmp_path, case, model_type):
    """A CLIPModel / SiglipModel directory around the case's image tower, with a stand-in text tower."""
    directory = _copy(tmp_path, case, model_type)
    vision = _config(directory)
    tensors = {f"vision_model.{name.removeprefix('vision_model.')}" if name != "visual_projection.weight" else name:
               value for name, value in _tensors(directory).items()}
    rng = np.random.default_rng(0)
    tensors.update({"text_model.embeddings.token_embedding.weight": rng.normal(size=(10, 16)).astype(np.float32),
                    "text_model.final_layer_norm.weight": np.ones(16, np.float32),
                    "logit_scale": np.ones((), np.float32)})
    if model_type == "clip":
        tensors["text_projection.weight"] = rng.normal(size=(24, 16)).astype(np.float32)
    else:
        tensors["logit_bias"] = np.zeros(1, np.float32)
    _write_tensors(directory, tensors)
    architecture = {"clip": "CLIPModel", "siglip": "SiglipModel"}[model_type]
    _write_config(directory, {"architectures": [architecture], "model_type": model_type,
                              "text_config": {"hidden_size": 16}, "vision_config": {
                                  key: value for key, value in vision.items() if key != "architectures"}})
    return directory


def test_clip_and_siglip_models_give_their_image_towers(tmp_path, caplog):
    # CLIPModel.get_image_features = visual_projection(vision_model(...).pooler_output): CLIPVisionModelWithProjection's
    # image_embeds; SiglipModel's = SiglipVisionModel's pooler_output. The text tower is left unread.
    caplog.set_level("INFO")
    _check(_full_model(tmp_path, "hf_clip_projection", "clip"), "hf_clip_projection", size=48)
    _check(_full_model(tmp_path, "hf_siglip_vision", "siglip"), "hf_siglip_vision", size=48)
    assert "a CLIPModel; its image tower is read, its text tower (4 tensors) is not" in caplog.text


def test_a_projection_in_a_clip_vision_model_is_ignored_as_transformers_does(tmp_path, caplog):
    directory = _copy(tmp_path, "hf_clip_vision")
    tensors = _tensors(directory)
    tensors["visual_projection.weight"] = np.ones((24, 32), np.float32)
    _write_tensors(directory, tensors)
    _check(directory, "hf_clip_vision")
    assert "visual_projection.weight is unused by a CLIPVisionModel" in caplog.text


# ------------------------------------------------------------------ refusals
def test_a_siglip_tower_without_its_head_is_refused(tmp_path):
    directory = _copy(tmp_path, "hf_siglip_vision")
    _edit_config(directory, vision_use_head=False)
    with pytest.raises(ValueError, match=r"hf_siglip_vision/config\.json: vision_use_head=False; .* no pooled output"):
        checkpoints.config_from_checkpoint(directory)


def test_a_dinov2_without_its_preprocessor_config_is_refused(tmp_path):
    directory = _copy(tmp_path, "hf_dinov2")
    os.remove(directory / "preprocessor_config.json")
    with pytest.raises(ValueError, match=r"hf_dinov2 has no preprocessor_config\.json: the mean and std a dinov2 "
                                         r"model expects are not stated"):
        checkpoints.config_from_checkpoint(directory)
    # CLIP's image processor states CLIP's mean and std: its defaults hold.
    directory = _copy(tmp_path, "hf_clip_vision")
    os.remove(directory / "preprocessor_config.json")
    assert checkpoints.config_from_checkpoint(directory).input_std == (0.26862954, 0.26130258, 0.27577711)


def test_a_swiglu_flag_the_tensors_contradict_is_refused(tmp_path):
    directory = _copy(tmp_path, "hf_dinov2")
    _edit_config(directory, use_swiglu_ffn=True)
    with pytest.raises(ValueError, match=r"config\.json: use_swiglu_ffn=True, but model\.safetensors holds mlp\.fc1"):
        checkpoints.config_from_checkpoint(directory)


def test_a_register_count_the_tensors_contradict_is_refused(tmp_path):
    directory = _copy(tmp_path, "hf_dinov2_registers")
    _edit_config(directory, num_register_tokens=2)
    with pytest.raises(ValueError, match=r"num_register_tokens=2, but embeddings\.register_tokens holds 4"):
        checkpoints.config_from_checkpoint(directory)


def test_a_dinov2_without_mlp_tensors_is_refused(tmp_path):
    directory = _copy(tmp_path, "hf_dinov2")
    _write_tensors(directory, {name: value for name, value in _tensors(directory).items() if ".mlp." not in name})
    with pytest.raises(ValueError, match=r"no encoder\.layer\.0\.mlp tensors in model\.safetensors"):
        checkpoints.config_from_checkpoint(directory)


def test_a_clip_model_without_its_vision_config_is_refused(tmp_path):
    directory = _full_model(tmp_path, "hf_clip_projection", "clip")
    cfg = _config(directory)
    del cfg["vision_config"]
    _write_config(directory, cfg)
    with pytest.raises(ValueError, match=r"model_type='clip' without a vision_config.* save the vision tower alone "
                                         r"\(.*CLIPVisionModelWithProjection\.from_pretrained"):
        checkpoints.config_from_checkpoint(directory)


def test_a_projection_model_without_its_projection_is_refused(tmp_path):
    directory = _copy(tmp_path, "hf_clip_projection")
    _write_tensors(directory, {k: v for k, v in _tensors(directory).items() if k != "visual_projection.weight"})
    with pytest.raises(ValueError, match=r"a CLIPVisionModelWithProjection .* expected the tensor "
                                         r"'visual_projection\.weight'"):
        checkpoints.config_from_checkpoint(directory)


def test_other_model_classes_of_the_families_are_refused_by_name(tmp_path):
    directory = _copy(tmp_path, "hf_dinov2")
    _edit_config(directory, architectures=["Dinov2Backbone"])
    with pytest.raises(ValueError, match=r"architectures=\['Dinov2Backbone'\]; keras_vit reads \['Dinov2Model', "
                                         r"'Dinov2ForImageClassification'\] of model_type 'dinov2'"):
        checkpoints.config_from_checkpoint(directory)


def test_a_dinov2_classifier_without_its_whole_head_is_refused(tmp_path):
    directory = _copy(tmp_path, "hf_dinov2_classifier")
    _write_tensors(directory, {k: v for k, v in _tensors(directory).items() if k != "classifier.bias"})
    with pytest.raises(ValueError, match=r"a Dinov2ForImageClassification .* expected the tensors "
                                         r"\['classifier\.bias'\]"):
        checkpoints.config_from_checkpoint(directory)


def test_unknown_tensors_of_the_families_are_refused(tmp_path):
    for case, extra in (("hf_dinov2", "encoder.layer.0.mlp.fc3.weight"), ("hf_clip_vision", "embeddings.patch_"
                                                                                           "embedding.bias")):
        directory = _copy(tmp_path, case)
        tensors = _tensors(directory)
        tensors[extra] = np.zeros(32, np.float32)  # CLIP's patch projection has no bias
        _write_tensors(directory, tensors)
        with pytest.raises(ValueError, match=rf"tensors keras_vit's ViT has no place for: \['{extra}'\]"):
            checkpoints.config_from_checkpoint(directory)


def test_a_tensor_both_with_and_without_the_prefix_is_refused(tmp_path):
    directory = _copy(tmp_path, "hf_clip_vision")
    tensors = _tensors(directory)
    tensors["vision_model.post_layernorm.bias"] = tensors["post_layernorm.bias"]
    _write_tensors(directory, tensors)
    with pytest.raises(ValueError, match=r"holds 'post_layernorm\.bias' both with and without the prefix "
                                         r"'vision_model\.'"):
        checkpoints.config_from_checkpoint(directory)
