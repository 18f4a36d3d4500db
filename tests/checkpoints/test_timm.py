"""timm / Hugging Face safetensors checkpoints (`keras_vit.checkpoints.timm`) against timm's own outputs.

The fixtures in tests/fixtures/timm/ were written by timm itself
(`make_timm_fixtures.py`: `save_for_hf`, seeded random weights, timm's logits);
no test here needs torch or timm.
"""

import json
import math
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import keras_vit
from keras_vit import checkpoints
from keras_vit.checkpoints import timm
from keras_vit.checkpoints.safetensors import read_safetensors
from keras_vit.config import IMAGENET_MEAN, IMAGENET_STD

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "timm")
LOGIT_ATOL = 2e-5  # float32 Keras vs float32 PyTorch; seen: under 1e-6

# case: (path under FIXTURES, the ViTConfig fields that make the case).
TIMM_NUMERICS = dict(gelu_approximate=False, layer_norm_epsilon=1e-6, interpolation="bicubic")
SMALL = dict(patch_size=(8, 8), hidden_size=64, mlp_dim=128, num_heads=4, image_size=(32, 32), channels=3,
             position_embedding="learned_1d", **TIMM_NUMERICS)
HALF = dict(input_mean=(0.5,) * 3, input_std=(0.5,) * 3)
CASES = {
    "augreg": ("augreg", dict(SMALL, num_layers=2, classifier="token", class_token=True, fc_norm=False,
                              no_embed_class=False, classes=10, **HALF)),
    "orig_in21k": ("orig_in21k", dict(SMALL, num_layers=2, classifier="token", class_token=True, classes=0, **HALF)),
    "deit": ("deit", dict(SMALL, num_layers=2, classifier="token", class_token=True, classes=10,
                          input_mean=IMAGENET_MEAN, input_std=IMAGENET_STD)),
    "gap_fc_norm": ("gap_fc_norm", dict(SMALL, num_layers=1, classifier="gap", class_token=True, fc_norm=True,
                                        classes=10, **HALF)),
    "gap_no_token": ("gap_no_token", dict(SMALL, num_layers=1, classifier="gap", class_token=False, fc_norm=False,
                                          classes=10, **HALF)),
    "no_embed_class": ("no_embed_class", dict(SMALL, num_layers=1, classifier="token", class_token=True,
                                              no_embed_class=True, classes=10, **HALF)),
    "deit_distilled": ("deit_distilled", dict(SMALL, num_layers=1, classifier="token", class_token=True,
                                              distilled=True, classes=10, input_mean=IMAGENET_MEAN,
                                              input_std=IMAGENET_STD)),
    # No config.json: all read off the shapes, 3 heads from timm's width 192.
    "bare": ("bare/weights.safetensors", dict(patch_size=(4, 4), hidden_size=192, mlp_dim=48, num_heads=3,
                                              num_layers=1, image_size=(16, 16), classifier="token",
                                              class_token=True, fc_norm=False, classes=10, **TIMM_NUMERICS, **HALF)),
}


def fixture(case):
    path, _ = CASES[case]
    with np.load(os.path.join(FIXTURES, f"{case}_io.npz")) as io:
        return os.path.join(FIXTURES, path), dict(io)


def write_safetensors(path, tensors):
    """A minimal safetensors writer: `{name: array}` or `{name: (dtype, shape, raw bytes)}`."""
    names = {np.dtype("float32"): "F32", np.dtype("float16"): "F16", np.dtype("float64"): "F64"}
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, value in tensors.items():
        if isinstance(value, tuple):
            dtype, shape, raw = value
        else:
            dtype, shape, raw = names[value.dtype], list(value.shape), np.ascontiguousarray(value).astype(
                value.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + b"".join(blobs))
    return str(path)


def augreg_tensors():
    return read_safetensors(os.path.join(FIXTURES, "augreg", "model.safetensors"))


def augreg_copy(tmp_path, tensors, with_config=True):
    """The augreg fixture with other tensors, as a hub directory (or a bare file)."""
    path = write_safetensors(tmp_path / "model.safetensors", tensors)
    if with_config:
        shutil.copy(os.path.join(FIXTURES, "augreg", "config.json"), tmp_path / "config.json")
        return str(tmp_path)
    return path


# ---------------------------------------------------------------- configuration
def test_read_gives_the_timm_models_config():
    for case, (path, expected) in CASES.items():
        config, _ = timm.read(os.path.join(FIXTURES, path))
        assert {name: getattr(config, name) for name in expected} == expected, case


def test_config_from_checkpoint_reads_timm_files():
    config = checkpoints.config_from_checkpoint(os.path.join(FIXTURES, "deit"))
    assert (config.input_mean, config.gelu_approximate, config.classes) == (IMAGENET_MEAN, False, 10)


def test_architecture_table_is_what_timm_builds():
    # architectures.json: what timm 1.0.31 builds for every plain ViT/DeiT name.
    with open(os.path.join(FIXTURES, "architectures.json")) as f:
        timm_built = json.load(f)["architectures"]
    for name, facts in timm_built.items():
        if not facts["qkv_bias"] or facts["layer_scale"]:
            assert name not in timm.ARCHITECTURES, name  # keras_vit cannot represent these
            continue
        args = timm.ARCHITECTURES[name]
        size = args["img_size"]
        ours = dict(embed_dim=args["embed_dim"], depth=args["depth"], num_heads=args["num_heads"],
                    mlp_dim=int(args["embed_dim"] * args.get("mlp_ratio", 4.0)),
                    patch_size=[args["patch_size"]] * 2, img_size=[size, size],
                    class_token=args.get("class_token", True), global_pool=args.get("global_pool", "token"),
                    fc_norm=bool(args.get("fc_norm")), no_embed_class=False, distilled=args.get("distilled", False))
        assert ours == {key: facts[key] for key in ours}, name
    assert set(timm.ARCHITECTURES) <= set(timm_built)


# ---------------------------------------------------------------- weights
def test_fused_qkv_splits_into_official_query_key_value_per_head():
    tensors = augreg_tensors()
    _, arrays = timm.read(os.path.join(FIXTURES, "augreg"))
    attention = "Transformer/encoderblock_1/MultiHeadDotProductAttention_1/"
    qkv_w, qkv_b = tensors["blocks.1.attn.qkv.weight"], tensors["blocks.1.attn.qkv.bias"]
    for part, name in enumerate(("query", "key", "value")):
        for head in range(4):  # timm's rows: [query; key; value], each head's 16 rows in order
            rows = slice(part * 64 + head * 16, part * 64 + (head + 1) * 16)
            np.testing.assert_array_equal(arrays[attention + f"{name}/kernel"][:, head, :], qkv_w[rows].T)
            np.testing.assert_array_equal(arrays[attention + f"{name}/bias"][head], qkv_b[rows])
    out = arrays[attention + "out/kernel"]
    assert out.shape == (4, 16, 64)
    np.testing.assert_array_equal(out[2], tensors["blocks.1.attn.proj.weight"][:, 32:48].T)
    np.testing.assert_array_equal(arrays["embedding/kernel"][1, 2, 0], tensors["patch_embed.proj.weight"][:, 0, 1, 2])
    np.testing.assert_array_equal(arrays["head/kernel"], tensors["head.weight"].T)


def test_fc_norm_is_written_under_its_extension_keys():
    tensors = read_safetensors(os.path.join(FIXTURES, "gap_fc_norm", "model.safetensors"))
    _, arrays = timm.read(os.path.join(FIXTURES, "gap_fc_norm"))
    np.testing.assert_array_equal(arrays["fc_norm/scale"], tensors["fc_norm.weight"])
    assert "Transformer/encoder_norm/scale" not in arrays


# ---------------------------------------------------------------- end to end
@pytest.mark.parametrize("case", sorted(CASES))
def test_from_checkpoint_gives_timms_logits(case):
    path, io = fixture(case)
    model = keras_vit.ViT.from_checkpoint(path, classifier_activation=None)
    inputs = keras_vit.preprocess_input(io["images"], config=model.vit_config)
    np.testing.assert_allclose(inputs, io["inputs"], rtol=0, atol=1e-6)
    np.testing.assert_allclose(np.asarray(model(inputs)), io["logits"], rtol=0, atol=LOGIT_ATOL)


@pytest.mark.parametrize("case", ["augreg", "gap_fc_norm", "no_embed_class"])
def test_read_then_load_arrays_gives_timms_logits(case):
    path, io = fixture(case)
    config, arrays = timm.read(path)
    model = keras_vit.ViT(config, classifier_activation=None)
    checkpoints.load_arrays(model, arrays, path)
    logits = model(keras_vit.preprocess_input(io["images"], config=config))
    np.testing.assert_allclose(np.asarray(logits), io["logits"], rtol=0, atol=LOGIT_ATOL)


def test_headless_orig_in21k_gives_timms_pooled_features():
    path, io = fixture("orig_in21k")
    model = keras_vit.ViT.from_checkpoint(path)
    features = model(keras_vit.preprocess_input(io["images"], config=model.vit_config))
    np.testing.assert_allclose(np.asarray(features), io["pre_logits"], rtol=0, atol=LOGIT_ATOL)


def test_odd_width_without_config_needs_num_heads_and_reads_with_it(tmp_path):
    path = augreg_copy(tmp_path, augreg_tensors(), with_config=False)
    with pytest.raises(ValueError, match=r"model\.safetensors.*width 64.*pass num_heads"):
        timm.read(path)
    config, _ = timm.read(path, num_heads=4)
    assert (config.num_heads, config.classifier, config.classes) == (4, "token", 10)


# ---------------------------------------------------------------- safetensors
def test_reader_converts_bf16_f16_f64_and_keeps_shapes(tmp_path):
    values = np.array([[1.0, -2.5, 3.140625], [0.0, 1e-3, -65504.0]], np.float32)
    bf16 = (values.view(np.uint32) >> 16).astype("<u2")  # exact for these values' top bits
    path = write_safetensors(tmp_path / "a.safetensors", {
        "bf16": ("BF16", (2, 3), bf16.tobytes()), "f16": values.astype(np.float16), "f64": values.astype(np.float64)})
    tensors = read_safetensors(path)
    np.testing.assert_array_equal(tensors["bf16"], (bf16.astype(np.uint32) << 16).view(np.float32))
    assert tensors["bf16"].dtype == np.float32 and tensors["bf16"][0, 1] == -2.5
    assert tensors["f16"].dtype == np.float16 and tensors["f64"].dtype == np.float64
    np.testing.assert_array_equal(tensors["f64"], values.astype(np.float64))


def test_unsupported_dtype_names_the_tensor_and_dtype(tmp_path):
    path = write_safetensors(tmp_path / "a.safetensors", {"steps": ("I32", (1,), b"\0" * 4)})
    with pytest.raises(ValueError, match=r"a\.safetensors.*'steps'.*I32"):
        read_safetensors(path)


def test_truncated_file_names_the_file_and_what_was_expected(tmp_path):
    source = os.path.join(FIXTURES, "augreg", "model.safetensors")
    with open(source, "rb") as f:
        data = f.read()
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(data[:-100])
    with pytest.raises(ValueError, match=r"cut\.safetensors is truncated: tensor .* needs bytes up to"):
        read_safetensors(cut)
    short = tmp_path / "short.safetensors"
    short.write_bytes(data[:5])
    with pytest.raises(ValueError, match=r"short\.safetensors is not a safetensors file: expected an 8-byte"):
        read_safetensors(short)
    header = tmp_path / "header.safetensors"
    header.write_bytes(data[:50])
    with pytest.raises(ValueError, match=r"header\.safetensors is truncated .* header length"):
        read_safetensors(header)


def test_corrupt_header_names_the_file(tmp_path):
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes((4).to_bytes(8, "little") + b"{{{{")
    with pytest.raises(ValueError, match=r"junk\.safetensors is not a safetensors file: expected a JSON header"):
        read_safetensors(junk)
    path = write_safetensors(tmp_path / "sizes.safetensors", {"w": ("F32", (2, 2), b"\0" * 12)})
    with pytest.raises(ValueError, match=r"sizes\.safetensors: tensor 'w' of shape \(2, 2\).*needs 16 bytes"):
        read_safetensors(path)


def _raw_safetensors(path, header_text, data):
    path.write_bytes(len(header_text).to_bytes(8, "little") + header_text.encode() + data)
    return path


@pytest.mark.parametrize("header, data, message", [
    ('{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, '
     '"b": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}', 8, r"'b' at data_offsets \[0, 8\) overlaps"),
    ('{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, '
     '"b": {"dtype": "F32", "shape": [2], "data_offsets": [24, 32]}}', 32, r"'b' .* leaves bytes 8-24 unused"),
    ('{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}', 12, r"end at byte 8 of a data section of 12"),
    ('{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, '
     '"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}', 16, r"names \['a'\] more than once"),
    ('{"a": {"dtype": "F32", "shape": [true, 2], "data_offsets": [0, 8]}}', 8, r"'a' has a malformed header entry"),
])
def test_a_header_whose_tensors_do_not_tile_the_data_is_refused(tmp_path, header, data, message):
    # Each would read garbage or another tensor's bytes without a word.
    path = _raw_safetensors(tmp_path / "odd.safetensors", header, np.arange(data, dtype=np.uint8).tobytes())
    with pytest.raises(ValueError, match=r"odd\.safetensors.*" + message):
        read_safetensors(path)


# ---------------------------------------------------------------- what keras_vit cannot represent
UNSUPPORTED = (  # extra timm weights, what the message must say
    ({"attn_pool.q_norm.weight": np.ones(16, np.float32)}, r"qk-norm in the attention pooling"),
    ({"blocks.0.attn.norm.weight": np.ones(64, np.float32)}, r"a norm inside attention or the MLP"),
)
# Weights of the later families (read since issue 50) in a file whose config.json says a plain ViT.
UNDESCRIBED = ({"blocks.0.ls1.gamma": np.ones(64, np.float32)}, {"norm_pre.weight": np.ones(64, np.float32)},
               {"blocks.1.attn.q_norm.weight": np.ones(16, np.float32)})


def test_a_distillation_token_in_a_file_that_says_otherwise_is_refused(tmp_path):
    extra = {"dist_token": np.zeros((1, 1, 64), np.float32), "head_dist.weight": np.zeros((10, 64), np.float32)}
    path = augreg_copy(tmp_path, {**augreg_tensors(), **extra})
    with pytest.raises(ValueError, match=r"config\.json says distilled=False but the weights have distilled=True"):
        timm.read(path)


@pytest.mark.parametrize("size", ["Ti", "S", "B"])
def test_deit_builders_have_timms_parameter_counts(size):
    with open(os.path.join(FIXTURES, "architectures.json")) as f:
        timm_built = json.load(f)["architectures"]
    name = {"Ti": "tiny", "S": "small", "B": "base"}[size]
    builder = getattr(keras_vit, f"DeiT_{size}16")
    for distilled in (False, True):
        timm_name = f"deit_{name}_{'distilled_' * distilled}patch16_224"
        assert builder(distilled=distilled).count_params() == timm_built[timm_name]["parameters"], timm_name


def test_unsupported_timm_features_raise_naming_the_file_and_feature(tmp_path):
    for extra, message in UNSUPPORTED:
        path = augreg_copy(tmp_path, {**augreg_tensors(), **extra})
        with pytest.raises(ValueError, match=r"model\.safetensors has .*" + message):
            timm.read(path)


def test_family_weights_a_plain_config_does_not_describe_are_refused(tmp_path):
    for extra in UNDESCRIBED:
        path = augreg_copy(tmp_path, {**augreg_tensors(), **extra})
        with pytest.raises(ValueError, match=rf"unknown weights: \['{re.escape(next(iter(extra)))}'\]"):
            timm.read(path)


def test_unknown_and_missing_weights_are_listed(tmp_path):
    tensors = augreg_tensors()
    tensors["blocks.0.mlp.fc1_g.weight"] = tensors["blocks.0.mlp.fc1.weight"]
    del tensors["blocks.1.norm2.bias"]
    with pytest.raises(ValueError, match=r"missing weights: \['blocks\.1\.norm2\.bias'\]; "
                                         r"unknown weights: \['blocks\.0\.mlp\.fc1_g\.weight'\]"):
        timm.read(augreg_copy(tmp_path, tensors))


def test_a_qkv_bias_missing_from_a_biased_model_is_refused(tmp_path):
    tensors = augreg_tensors()
    del tensors["blocks.0.attn.qkv.bias"]
    with pytest.raises(ValueError, match=r"missing weights: \['blocks\.0\.attn\.qkv\.bias'\]"):
        timm.read(augreg_copy(tmp_path, tensors))


CONFIG_CHANGES = (  # a change to augreg's config.json, what the message must say
    (dict(architecture="eva_giant_patch14_224"), r"architecture 'eva_giant_patch14_224' is not"),
    (dict(model_args=dict(scale_attn_norm=True)), r"model_args \{'scale_attn_norm': True\}.*cannot represent"),
    (dict(model_args=dict(global_pool="max")), r"global_pool='max'"),
    (dict(model_args=dict(global_pool="map")), r"says map_head=True but the weights have map_head=False"),
    (dict(model_args=dict(reg_tokens=2)), r"says num_register_tokens=2 but the weights have num_register_tokens=0"),
    (dict(model_args=dict(act_layer="relu")), r"act_layer='relu'"),
    (dict(model_args=dict(embed_dim=96)), r"says hidden_size=96 but the weights have hidden_size=64"),
    (dict(model_args=dict(img_size=48)), r"6x6 patch grid .* 37 positions; the weights' pos_embed has 17"),
    (dict(model_args=dict(new_thing=1)), r"model_args \['new_thing'\] are unknown"),
    # Numbers written as strings: a bare TypeError deep in the reader named neither file nor field.
    (dict(model_args=dict(embed_dim="64")),
     r"model_args.embed_dim must be an integer \(JSON numbers, unquoted\); received embed_dim='64'"),
    (dict(num_classes="10"), r": num_classes must be an integer .*received num_classes='10'"),
    (dict(model_args=dict(mlp_ratio="4.0")), r"model_args.mlp_ratio must be a number .*received mlp_ratio='4.0'"),
)


def test_config_json_keras_vit_cannot_follow_raises(tmp_path):
    path = augreg_copy(tmp_path, augreg_tensors())
    with open(os.path.join(path, "config.json")) as f:
        original = json.load(f)
    for change, message in CONFIG_CHANGES:
        config = {key: {**original[key], **value} if isinstance(value, dict) else value
                  for key, value in {**original, **change}.items()}
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(config, f)
        with pytest.raises(ValueError, match=r"config\.json.*" + message):
            timm.read(path)


def test_a_config_json_of_a_family_with_a_plain_vits_weights_is_refused(tmp_path):
    path = augreg_copy(tmp_path, augreg_tensors())
    config = json.loads(Path(path, "config.json").read_text())
    config["model_args"]["init_values"] = 1e-5  # LayerScale, which the weights lack
    Path(path, "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"missing weights: \['blocks\.0\.ls1\.gamma', 'blocks\.0\.ls2\.gamma'"):
        timm.read(path)


def test_directory_without_weights_or_config_raises(tmp_path):
    with pytest.raises(ValueError, match=r"expected model\.safetensors, found \[\]"):
        timm.read(tmp_path)
    write_safetensors(tmp_path / "model.safetensors", augreg_tensors())
    with pytest.raises(ValueError, match=r"expected config\.json beside model\.safetensors"):
        timm.read(tmp_path)


def test_bare_file_infers_no_embed_class_and_gap_from_shapes(tmp_path):
    tensors = read_safetensors(os.path.join(FIXTURES, "gap_fc_norm", "model.safetensors"))
    config, _ = timm.read(augreg_copy(tmp_path, tensors, with_config=False), num_heads=4)
    assert (config.classifier, config.class_token, config.fc_norm, config.no_embed_class) == ("gap", True, True, False)
    tensors = read_safetensors(os.path.join(FIXTURES, "no_embed_class", "model.safetensors"))
    config, _ = timm.read(augreg_copy(tmp_path, tensors, with_config=False), num_heads=4)
    assert (config.classifier, config.no_embed_class, config.grid_size) == ("token", True, (4, 4))
    assert math.prod(config.grid_size) == tensors["pos_embed"].shape[1]


def test_non_square_patches_keep_their_layout(tmp_path):
    tensors = augreg_tensors()
    kernel = np.random.default_rng(0).normal(size=(64, 3, 4, 16)).astype(np.float32)
    tensors["patch_embed.proj.weight"] = kernel  # 4x16 patches; the 17 positions: a 4x4 grid + class token
    config, arrays = timm.read(augreg_copy(tmp_path, tensors, with_config=False), num_heads=4)
    assert (config.patch_size, config.image_size) == ((4, 16), (16, 64))
    np.testing.assert_array_equal(arrays["embedding/kernel"][3, 9, 2], kernel[:, 2, 3, 9])  # (ph, pw, C, D)


def test_bare_file_takes_image_size_where_the_table_fits_it(tmp_path):
    tensors = augreg_tensors()
    tensors["pos_embed"] = np.zeros((1, 25, 64), np.float32)  # class token + 4x6, or (no_embed_class) 5x5
    path = augreg_copy(tmp_path, tensors, with_config=False)
    config, _ = timm.read(path, num_heads=4, image_size=(32, 48))
    assert (config.grid_size, config.no_embed_class) == ((4, 6), False)
    # A size the table does not fit (a resize target) leaves the square reading.
    config, _ = timm.read(path, num_heads=4, image_size=64)
    assert (config.grid_size, config.no_embed_class) == ((5, 5), True)
    # A class token and a square 4x4 grid: a target size of 17 patches is a resize, not DeiT-3's layout.
    tensors["pos_embed"] = np.zeros((1, 17, 64), np.float32)
    config, _ = timm.read(augreg_copy(tmp_path, tensors, with_config=False), num_heads=4, image_size=(8, 136))
    assert config.no_embed_class is False
    tensors["pos_embed"] = np.zeros((1, 24, 64), np.float32)
    with pytest.raises(ValueError, match=r"model\.safetensors: pos_embed holds 24 positions, not a square grid"):
        timm.read(augreg_copy(tmp_path, tensors, with_config=False), num_heads=4)
