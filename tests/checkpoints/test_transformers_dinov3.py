"""transformers' DINOv3ViTModel: read with transformers' own outputs at 32 and 48 px, written back bit for bit.

The fixtures in tests/fixtures/rope/hf_dinov3{,_gated} were written by
transformers 5.24 itself (`make_rope_fixtures.py`: `save_pretrained` of tiny
random models, blocks on disk as `layer.{i}`, with `last_hidden_state` and
`pooler_output` at the file's 32 px and of the same model called at 48 px:
rotary positions, no table to resize). keras_vit reads them without torch.
That transformers loads what keras_vit writes (strictly: no missing,
unexpected or mismatched keys) with the same outputs is checked with
transformers itself, outside the suite, as for the other families:
`tests/fixtures/make_hf_fixtures.py --verify DIR`.
"""

import json
import os
import re
import shutil
import types

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import checkpoints
from keras_vit.checkpoints.safetensors import read_safetensors, write_safetensors

ROPE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "rope")
ATOL = 1e-5  # float32 against transformers' float32 (seen: 1.3e-6 at most)
CASES = {
    "hf_dinov3": dict(gated_mlp=False, activation="gelu", gelu_approximate=False),
    "hf_dinov3_gated": dict(gated_mlp=True, activation="silu"),
}
# What both fixtures' config.json give (DINOv3ViTConfig with 4 registers, patch 8, hidden 32, 2 heads, 2 layers).
FIELDS = dict(
    patch_size=(8, 8), hidden_size=32, mlp_dim=128, num_heads=2, num_layers=2, image_size=(32, 32),
    classifier="token", class_token=True, classes=0, num_register_tokens=4, position_embedding="none",
    rotary_embedding="rope_dinov3", rope_theta=100.0, dynamic_image_size=True, qkv_bias="qv",
    layer_scale_init=1.0, layer_norm_epsilon=1e-5, fc_norm=False, patch_bias=True,
    input_mean=(0.485, 0.456, 0.406), input_std=(0.229, 0.224, 0.225),
)
# How the 48 px outputs are reached: the file's dynamic model called at 48 px, or the model read at image_size=48.
READS = ("32", "dynamic_48", "image_size_48")


def _io(case):
    with np.load(os.path.join(ROPE, f"{case}_io.npz")) as io:
        return {key: io[key] for key in io.files}


def _run(model, inputs):
    """(pooler_output, last_hidden_state): the model's output, the final-normed class token, and the sequence
    after the final norm."""
    both = keras.Model(model.input, [model.outputs[0], model.get_layer("encoder_norm").output])
    return tuple(np.asarray(x) for x in both(inputs))


@pytest.fixture(scope="module")
def read():
    """{(case, read): (config, pooler_output, last_hidden_state)}: each model built once for the module."""
    out = {}
    for case in CASES:
        io, directory = _io(case), os.path.join(ROPE, case)
        model = keras_vit.ViT.from_checkpoint(directory)
        out[case, "32"] = (model.vit_config, *_run(model, io["inputs"]))
        out[case, "dynamic_48"] = (model.vit_config, *_run(model, io["inputs_48"]))
        model = keras_vit.ViT.from_checkpoint(directory, image_size=48)
        out[case, "image_size_48"] = (model.vit_config, *_run(model, io["inputs_48"]))
    return out


@pytest.mark.parametrize("how", READS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_dinov3_gives_transformers_outputs(read, case, how):
    config, pooled, sequence = read[case, how]
    suffix = "" if how == "32" else "_48"
    io = _io(case)
    np.testing.assert_allclose(pooled, io["pooler_output" + suffix], atol=ATOL)
    np.testing.assert_allclose(sequence, io["last_hidden_state" + suffix], atol=ATOL)
    fields = dict(FIELDS, **CASES[case], image_size=(48, 48) if how == "image_size_48" else (32, 32))
    assert {name: getattr(config, name) for name in fields} == fields


def test_the_model_output_is_the_final_normed_class_token(read):
    # transformers' pooler_output = last_hidden_state[:, 0]; keras_vit's classifier="token" without fc_norm.
    for (case, how), (_, pooled, sequence) in read.items():
        np.testing.assert_array_equal(pooled, sequence[:, 0], err_msg=f"{case} {how}")


def _json(directory, name):
    with open(os.path.join(directory, name), encoding="utf-8") as f:
        return json.load(f)


# config.json fields DINOv3ViTConfig builds the model from (the backbone's stage_names / out_features are its own).
CONFIG_FIELDS = ("architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads", "hidden_act", "layer_norm_eps", "rope_theta", "image_size", "patch_size",
                 "num_channels", "query_bias", "key_bias", "value_bias", "proj_bias", "mlp_bias", "layerscale_value",
                 "use_gated_mlp", "num_register_tokens", "pos_embed_shift", "pos_embed_jitter", "pos_embed_rescale")


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_dinov3_fixture_written_back_is_what_transformers_wrote(tmp_path, case):
    source = os.path.join(ROPE, case)
    model = keras_vit.ViT.from_checkpoint(source)
    written = checkpoints.save_transformers(model, str(tmp_path / case))
    theirs = read_safetensors(os.path.join(source, "model.safetensors"))
    ours = read_safetensors(os.path.join(written, "model.safetensors"))
    assert sorted(ours) == sorted(theirs)  # blocks as layer.{i}, as transformers writes them
    for name in theirs:
        assert ours[name].dtype == theirs[name].dtype and ours[name].shape == theirs[name].shape, name
        if name == "embeddings.mask_token":  # masked-image modelling's token, not held: transformers' initial zeros
            np.testing.assert_array_equal(ours[name], 0)
            continue
        np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)
    expected, got = _json(source, "config.json"), _json(written, "config.json")
    for key in CONFIG_FIELDS:
        assert got.get(key) == expected.get(key), key
    assert _json(written, "preprocessor_config.json") == _json(source, "preprocessor_config.json")
    reread = keras_vit.ViT.from_checkpoint(written)
    assert reread.vit_config == model.vit_config
    io = _io(case)
    np.testing.assert_allclose(np.asarray(reread(io["inputs_48"])), io["pooler_output_48"], atol=ATOL)


BASE = dict(hidden_size=32, num_heads=2, num_layers=1, classes=0, position_embedding="none",
            rotary_embedding="rope_dinov3", layer_scale_init=1e-5, layer_norm_epsilon=1e-5, patch_size=8,
            image_size=32, mlp_dim=64)
# name: (the model's fields, config.json's (query_bias, key_bias, value_bias))
MODELS = {
    "all_biases_theta": (dict(BASE, qkv_bias="all", num_register_tokens=2, rope_theta=1000.0,
                              dynamic_image_size=True, gelu_approximate=True), (True, True, True)),
    "no_biases_gated_no_registers": (dict(BASE, qkv_bias="none", gated_mlp=True, activation="silu", patch_size=(8, 4),
                                          image_size=(32, 48), dynamic_image_size=True), (False, False, False)),
}


def _as_read(config):
    """A model's config as its written folder reads back: the theta stated (100, the kind's own, for None), and
    resolution-free, as transformers' model is."""
    return config.replace(rope_theta=config.rope_theta or 100.0, dynamic_image_size=True)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_keras_vit_dinov3_model_round_trips(tmp_path, name):
    fields, biases = MODELS[name]
    model = keras_vit.ViT(**fields)
    for weight in model.weights:
        weight.assign(np.random.default_rng(len(weight.path)).normal(0, 0.3, weight.shape))
    directory = checkpoints.save_transformers(model, str(tmp_path / name))
    cfg = _json(directory, "config.json")
    assert cfg["architectures"] == ["DINOv3ViTModel"]
    assert (cfg["query_bias"], cfg["key_bias"], cfg["value_bias"]) == biases
    tensors = read_safetensors(os.path.join(directory, "model.safetensors"))
    assert tensors["embeddings.register_tokens"].shape == (1, model.vit_config.num_register_tokens, 32)
    reread = keras_vit.ViT.from_checkpoint(directory)
    assert reread.vit_config == _as_read(model.vit_config)
    images = np.random.default_rng(0).normal(size=(2, 40, 40, 3)).astype("float32")  # another grid
    np.testing.assert_allclose(np.asarray(reread(images)), np.asarray(model(images)), atol=1e-6)


def test_a_fixed_size_model_is_written_as_transformers_resolution_free_model(tmp_path):
    model = keras_vit.ViT(**dict(BASE, qkv_bias="qv", num_register_tokens=4))
    reread = keras_vit.ViT.from_checkpoint(checkpoints.save_transformers(model, str(tmp_path / "m")))
    assert not model.vit_config.dynamic_image_size and reread.vit_config == _as_read(model.vit_config)


def _copy(tmp_path, case="hf_dinov3"):
    target = tmp_path / case
    shutil.copytree(os.path.join(ROPE, case), target)
    return target


def _edit(directory, drop=(), add=None, **config):
    """The directory's config.json with `config`, its tensors without those matching `drop` and with `add`."""
    cfg = {**_json(directory, "config.json"), **config}
    with open(directory / "config.json", "w") as f:
        json.dump(cfg, f)
    tensors = read_safetensors(directory / "model.safetensors")
    tensors = {name: value for name, value in tensors.items() if not any(part in name for part in drop)}
    write_safetensors(directory / "model.safetensors", {**tensors, **(add or {})})


def _weights(model):
    return {weight.path: np.asarray(weight) for weight in model.weights}


def test_biases_config_json_leaves_out_are_zeros(tmp_path):
    # A key bias without a query bias: read as qkv_bias="all" with a zero query bias (what transformers' q_proj
    # without bias computes); no o_proj or MLP biases: zeros. Transformers turns keys, bias included, by RoPE, so
    # the key bias is kept (it changes the logits).
    directory = _copy(tmp_path)
    key_bias = {f"layer.{i}.attention.k_proj.bias": np.full(32, 0.5, np.float32) for i in range(2)}
    _edit(directory, drop=("q_proj.bias", "o_proj.bias", "mlp.up_proj.bias", "mlp.down_proj.bias"), add=key_bias,
          query_bias=False, key_bias=True, proj_bias=False, mlp_bias=False)
    model = keras_vit.ViT.from_checkpoint(directory)
    assert model.vit_config.qkv_bias == "all"
    weights = _weights(model)
    zeros = [path for path in weights if re.search(r"(query_bias|output_bias|dense_\d/bias)$", path)]
    assert len(zeros) == 8 and all(not weights[path].any() for path in zeros)
    keys = [path for path in weights if path.endswith("key_bias")]
    assert len(keys) == 2 and all((weights[path] == 0.5).all() for path in keys)


def test_the_training_only_rope_augmentations_are_not_read(tmp_path):
    # pos_embed_shift / jitter / rescale act in transformers' training mode only: the outputs are the same.
    directory = _copy(tmp_path)
    _edit(directory, pos_embed_shift=0.1, pos_embed_jitter=0.2, pos_embed_rescale=4.0)
    io = _io("hf_dinov3")
    pooled, sequence = _run(keras_vit.ViT.from_checkpoint(directory), io["inputs"])
    np.testing.assert_allclose(pooled, io["pooler_output"], atol=ATOL)
    np.testing.assert_allclose(sequence, io["last_hidden_state"], atol=ATOL)


@pytest.mark.parametrize("edit, message", [
    (dict(drop=("k_proj.bias",), key_bias=True), r"config\.json: key_bias=True, but model\.safetensors lacks "
                                                  r"\['layer\.0\.attention\.k_proj\.bias'"),
    (dict(drop=("v_proj.bias",)), r"value_bias=True, but model\.safetensors lacks"),
    (dict(query_bias=False), r"query_bias=False, but model\.safetensors holds \['layer\.0\.attention\.q_proj\.bias'"),
    (dict(use_gated_mlp=True), r"use_gated_mlp=True, but model\.safetensors holds no mlp\.gate_proj"),
    (dict(num_register_tokens=2), r"num_register_tokens=2, but embeddings\.register_tokens holds 4"),
    (dict(hidden_act="relu"), r"hidden_act='relu'; keras_vit's MLP computes"),
    (dict(architectures=["DINOv3ViTBackbone"]), r"architectures=\['DINOv3ViTBackbone'\]; keras_vit reads "
                                                r"\['DINOv3ViTModel'\] of model_type 'dinov3_vit'"),
])
def test_files_that_disagree_with_their_config_are_refused_by_name(tmp_path, edit, message):
    directory = _copy(tmp_path)
    _edit(directory, **edit)
    with pytest.raises(ValueError, match=message):
        keras_vit.ViT.from_checkpoint(directory)


def _refused(tmp_path, fields, message):
    """save_transformers refuses a model of `fields` naming them; nothing is written."""
    model = types.SimpleNamespace(vit_config=keras_vit.ViTConfig(**fields), name="m")
    with pytest.raises(ValueError, match=message):
        checkpoints.save_transformers(model, str(tmp_path / "x"))
    assert not os.path.exists(tmp_path / "x")


@pytest.mark.parametrize("fields, message", [
    (dict(BASE, classes=3, position_embedding="learned_1d"),
     r"transformers' DINOv3ViTModel \(the class for rotary_embedding='rope_dinov3'\) cannot represent this model: "
     r"position_embedding='learned_1d' .* classes=3 \(transformers: no head\)"),
    (dict(BASE, layer_scale_init=None, classifier="gap", qk_norm=True),
     r"classifier='gap' .* qk_norm=True .* layer_scale_init=None"),
    (dict(BASE, rotary_embedding="rope_eva"), r"rotary_embedding='rope_eva' \(transformers: no rotary positions\)"),
    (dict(BASE, rotary_embedding="rope_axial", layer_scale_init=None, position_embedding="learned_1d"),
     r"transformers' ViT cannot represent this model: rotary_embedding='rope_axial'"),
])
def test_models_dinov3_cannot_represent_are_refused_by_name(tmp_path, fields, message):
    _refused(tmp_path, fields, message)


def test_a_lone_dinov3_file_asks_for_its_folder(tmp_path):
    # Its heads, epsilon, activation, biases and theta are in config.json only.
    lone = tmp_path / "model.safetensors"
    shutil.copy(os.path.join(ROPE, "hf_dinov3", "model.safetensors"), lone)
    with pytest.raises(ValueError, match=r"holds transformers tensors .* expected its folder, with the config\.json"):
        keras_vit.ViT.from_checkpoint(lone)
