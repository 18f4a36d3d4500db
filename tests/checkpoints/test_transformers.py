"""Hugging Face `transformers` directories: read with transformers' outputs, and written back.

The fixtures in tests/fixtures/hf/ were written by transformers itself
(`make_hf_fixtures.py`: `save_pretrained` of tiny random ViT / DeiT models,
with their outputs); keras_vit reads them without torch or transformers.
"""

import json
import os
import re
import shutil

import numpy as np
import pytest

import keras_vit
from keras_vit import checkpoints
from keras_vit.checkpoints import hf_transformers
from keras_vit.checkpoints.resolve import checkpoint_format
from keras_vit.checkpoints.safetensors import read_safetensors, write_safetensors

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "hf")
TIMM_DIRECTORY = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "timm", "augreg")

CASES = {  # case: the ViTConfig fields it must give
    "vit_classifier": dict(classes=5, gelu_approximate=False, layer_norm_epsilon=1e-12,
                           input_mean=(0.4, 0.5, 0.6), input_std=(0.2, 0.25, 0.3), distilled=False),
    "vit_model": dict(classes=0, representation_size=24, input_mean=(0.5,) * 3),
    "vit_tanh": dict(classes=5, gelu_approximate=True, layer_norm_epsilon=1e-6),
    "deit_teacher": dict(classes=5, distilled=True, input_mean=(0.485, 0.456, 0.406)),
}


def _io(case):
    with np.load(os.path.join(FIXTURES, f"{case}_io.npz")) as io:
        return io["inputs"], io["outputs"]


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("scan_layers", [False, True])
def test_transformers_directories_give_transformers_outputs(case, scan_layers):
    model = keras_vit.ViT.from_checkpoint(os.path.join(FIXTURES, case), classifier_activation=None,
                                          scan_layers=scan_layers)
    assert {name: getattr(model.vit_config, name) for name in CASES[case]} == CASES[case]
    inputs, outputs = _io(case)
    np.testing.assert_allclose(np.asarray(model(inputs)), outputs, atol=1e-4)


def test_positions_resize_as_transformers_resizes_them():
    # transformers' ViTEmbeddings.interpolate_pos_encoding: PyTorch's bicubic without antialiasing, not timm's rule
    # (about 0.16 apart on this table). The fixture: transformers itself at 48 px (make_family_fixtures.py).
    model = keras_vit.ViT.from_checkpoint(os.path.join(FIXTURES, "vit_classifier"), classifier_activation=None,
                                          image_size=48)
    assert model.vit_config.interpolation == "bicubic_no_antialias"
    with np.load(os.path.join(os.path.dirname(FIXTURES), "families", "hf_vit_classifier_48_io.npz")) as io:
        np.testing.assert_allclose(np.asarray(model.get_layer("position_embedding").weights[0]), io["pos_embed_48"],
                                   atol=1e-5)
        np.testing.assert_allclose(np.asarray(model(io["inputs_48"])), io["logits_48"], atol=1e-5)


def test_the_format_is_told_by_config_json():
    assert checkpoint_format(os.path.join(FIXTURES, "vit_classifier"))[0] is hf_transformers
    assert not hf_transformers.matches(TIMM_DIRECTORY)  # timm's config.json has no model_type
    assert checkpoint_format(TIMM_DIRECTORY)[0] is not hf_transformers


def test_labels_are_read(tmp_path):
    assert hf_transformers.labels(os.path.join(FIXTURES, "vit_classifier")) == ["cat", "dog", "bird", "fish", "frog"]
    assert hf_transformers.labels(os.path.join(FIXTURES, "vit_model")) is None
    # What the exporter takes by default: a format's stated names; transformers' placeholders are none.
    assert checkpoints.checkpoint_labels(os.path.join(FIXTURES, "vit_classifier"))[0] == "cat"
    placeholder = checkpoints.save_transformers(keras_vit.ViT.from_checkpoint(os.path.join(FIXTURES, "vit_tanh")),
                                                str(tmp_path / "placeholder"))
    assert hf_transformers.labels(placeholder)[0] == "LABEL_0" and checkpoints.checkpoint_labels(placeholder) is None
    assert checkpoints.checkpoint_labels(os.path.join(os.path.dirname(FIXTURES), "token.npz")) is None


def test_id2label_is_read_by_its_keys_and_a_gap_is_refused(tmp_path):
    """JSON promises no key order, and a skipped id would shift every later name by one class."""
    folder = tmp_path / "vit"
    shutil.copytree(os.path.join(FIXTURES, "vit_classifier"), folder)
    config = json.loads((folder / "config.json").read_text())
    for id2label, expected in (({"1": "dog", "0": "cat", "2": "bird"}, ["cat", "dog", "bird"]),
                               ({"0": "cat", "1": "dog", "3": "fish"}, r"must name every class from 0 to 3; "
                                                                       r"it skips \[2\]"),
                               ({"0": "cat", "one": "dog"}, r"must be keyed by class indices 0, 1, ...; "
                                                            r"received key 'one'"),
                               ({"0": "cat", "01": "dog"}, r"must be keyed .* received key '01'")):
        (folder / "config.json").write_text(json.dumps({**config, "id2label": id2label}))
        if isinstance(expected, list):
            assert hf_transformers.labels(str(folder)) == expected
        else:
            with pytest.raises(ValueError, match=re.escape(str(folder / "config.json")) + ": id2label " + expected):
                hf_transformers.labels(str(folder))


def test_weights_load_into_a_built_model():
    model = keras_vit.ViT(checkpoints.config_from_checkpoint(os.path.join(FIXTURES, "vit_tanh")),
                          weights=os.path.join(FIXTURES, "vit_tanh"), classifier_activation=None)
    inputs, outputs = _io("vit_tanh")
    np.testing.assert_allclose(np.asarray(model(inputs)), outputs, atol=1e-4)


@pytest.mark.parametrize("case", sorted(CASES))
def test_written_directories_are_what_transformers_wrote(tmp_path, case):
    # Reading then writing gives transformers' own tensors and numerics back, so from_pretrained loads them as
    # it loads its own files (checked with transformers itself: make_hf_fixtures.py --verify DIR).
    source = os.path.join(FIXTURES, case)
    model = keras_vit.ViT.from_checkpoint(source)
    written = checkpoints.save_transformers(model, str(tmp_path / case), labels=hf_transformers.labels(source))
    theirs, ours = read_safetensors(os.path.join(source, "model.safetensors")), \
        read_safetensors(os.path.join(written, "model.safetensors"))
    assert sorted(ours) == sorted(theirs)
    for name in theirs:
        np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)
    with open(os.path.join(source, "config.json")) as f, open(os.path.join(written, "config.json")) as g:
        expected, got = json.load(f), json.load(g)
    for key in ("architectures", "model_type", "hidden_act", "layer_norm_eps", "image_size", "patch_size",
                "hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers", "id2label",
                "pooler_output_size"):
        assert got.get(key) == expected.get(key), key
    reread = keras_vit.ViT.from_checkpoint(written, classifier_activation=None)
    assert reread.vit_config == model.vit_config
    inputs, outputs = _io(case)
    np.testing.assert_allclose(np.asarray(reread(inputs)), outputs, atol=1e-4)


def test_a_keras_vit_model_round_trips(tmp_path):
    model = keras_vit.ViT(patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2, image_size=(32, 48),
                          classes=3, classifier_activation=None)
    for weight in model.weights:
        weight.assign(np.random.default_rng(len(weight.path)).normal(0, 0.3, weight.shape))
    images = np.random.default_rng(0).normal(size=(2, 32, 48, 3)).astype("float32")
    directory = checkpoints.save_transformers(model, str(tmp_path / "m"))
    reread = keras_vit.ViT.from_checkpoint(directory, classifier_activation=None)
    np.testing.assert_allclose(np.asarray(reread(images)), np.asarray(model(images)), atol=1e-5)
    assert hf_transformers.labels(directory) == ["LABEL_0", "LABEL_1", "LABEL_2"]


def test_models_transformers_cannot_represent_are_refused(tmp_path):
    small = dict(patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1, image_size=32, classes=3)
    for fields, message in ((dict(classifier="gap"), r"classifier='gap' \(transformers: 'token'\)"),
                            (dict(no_embed_class=True), r"no_embed_class=True"),
                            (dict(representation_size=16), r"representation_size=16 with a head"),
                            (dict(activation="quick_gelu"), r"activation='quick_gelu'"),
                            (dict(qkv_bias="none"), r"qkv_bias='none'"),
                            (dict(patch_bias=False), r"patch_bias=False")):
        with pytest.raises(ValueError, match=r"transformers' ViT cannot represent this model: .*" + message):
            checkpoints.save_transformers(keras_vit.ViT(**small, **fields), str(tmp_path / "x"))
    with pytest.raises(ValueError, match=r"`labels` must name each of the 3 classes; received 2 names"):
        checkpoints.save_transformers(keras_vit.ViT(**small), str(tmp_path / "x"), labels=["a", "b"])
    assert not os.path.exists(tmp_path / "x")


def _copy(tmp_path, case="vit_classifier"):
    target = tmp_path / case
    shutil.copytree(os.path.join(FIXTURES, case), target)
    return target


def _edit_config(directory, **changes):
    with open(directory / "config.json") as f:
        cfg = json.load(f)
    cfg.update(changes)
    with open(directory / "config.json", "w") as f:
        json.dump(cfg, f)


def test_files_keras_vit_cannot_represent_are_refused(tmp_path):
    for changes, message in ((dict(qkv_bias=False), r"qkv_bias=False"),
                             (dict(hidden_act="relu"), r"hidden_act='relu'"),
                             (dict(architectures=["ViTForMaskedImageModeling"]), r"architectures="),
                             (dict(image_size=48), r"says a 6x6 grid .* 37 positions; .* has 17")):
        directory = _copy(tmp_path)
        _edit_config(directory, **changes)
        with pytest.raises(ValueError, match=message):
            checkpoints.config_from_checkpoint(directory)
        shutil.rmtree(directory)
    # DeiTForImageClassification: the class token's head alone, which keras_vit's distilled model does not compute.
    directory = _copy(tmp_path, "deit_teacher")
    tensors = read_safetensors(directory / "model.safetensors")
    tensors = {("classifier" + name[len("cls_classifier"):] if name.startswith("cls_") else name): value
               for name, value in tensors.items() if not name.startswith("distillation_classifier")}
    write_safetensors(directory / "model.safetensors", tensors)
    _edit_config(directory, architectures=["DeiTForImageClassification"])
    with pytest.raises(ValueError, match=r"architectures=\['DeiTForImageClassification'\]"):
        checkpoints.config_from_checkpoint(directory)


def test_without_preprocessor_config_the_image_processors_defaults_hold(tmp_path):
    for case, mean in (("vit_classifier", (0.5, 0.5, 0.5)), ("deit_teacher", (0.485, 0.456, 0.406))):
        directory = _copy(tmp_path, case)
        os.remove(directory / "preprocessor_config.json")
        assert checkpoints.config_from_checkpoint(directory).input_mean == mean


def test_pytorch_bin_is_refused_with_how_to_resave(tmp_path):
    directory = _copy(tmp_path)
    os.remove(directory / "model.safetensors")
    (directory / "pytorch_model.bin").write_bytes(b"not opened")
    with pytest.raises(ValueError, match=r"pytorch_model\.bin.*save_pretrained\(dir, safe_serialization=True\)"):
        keras_vit.ViT.from_checkpoint(directory)


def test_sharded_directories_are_read(tmp_path):
    directory = _copy(tmp_path)
    tensors = read_safetensors(directory / "model.safetensors")
    os.remove(directory / "model.safetensors")
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, shard_names in shards.items():
        write_safetensors(directory / shard, {name: tensors[name] for name in shard_names})
    index = {"weight_map": {name: shard for shard, shard_names in shards.items() for name in shard_names}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    model = keras_vit.ViT.from_checkpoint(directory, classifier_activation=None)
    inputs, outputs = _io("vit_classifier")
    np.testing.assert_allclose(np.asarray(model(inputs)), outputs, atol=1e-4)


def test_unknown_tensors_are_refused(tmp_path):
    directory = _copy(tmp_path)
    tensors = read_safetensors(directory / "model.safetensors")
    tensors["decoder.0.weight"] = np.zeros((4, 4), np.float32)
    write_safetensors(directory / "model.safetensors", tensors)
    with pytest.raises(ValueError, match=r"tensors keras_vit's ViT has no place for: \['decoder\.0\.weight'\]"):
        checkpoints.config_from_checkpoint(directory)


def test_a_family_keras_vit_does_not_read_is_refused_by_its_model_type(tmp_path):
    directory = _copy(tmp_path)
    _edit_config(directory, model_type="swin")
    with pytest.raises(ValueError, match=r"config\.json: model_type='swin'; keras_vit reads transformers model_type"):
        checkpoints.config_from_checkpoint(directory)


def test_a_lone_model_safetensors_asks_for_its_folder(tmp_path):
    place = tmp_path / "model.safetensors"
    shutil.copy(os.path.join(FIXTURES, "vit_classifier", "model.safetensors"), place)
    with pytest.raises(ValueError, match=r"model\.safetensors holds transformers tensors .* expected its "
                                         r"folder, with the config\.json beside model\.safetensors .* no config\.json"):
        checkpoints.config_from_checkpoint(place)


def test_a_classifier_without_its_whole_head_is_refused(tmp_path):
    for case, drop, architectures in (("vit_classifier", ("classifier.bias",), None),
                                      ("vit_classifier", ("classifier.weight", "classifier.bias"), None),
                                      ("deit_teacher", ("distillation_classifier.bias",), None),
                                      ("vit_classifier", ("classifier.weight", "classifier.bias"),
                                       ["ViTForImageClassification"])):
        directory = _copy(tmp_path, case)
        tensors = read_safetensors(directory / "model.safetensors")
        write_safetensors(directory / "model.safetensors", {k: v for k, v in tensors.items() if k not in drop})
        if architectures:
            _edit_config(directory, architectures=architectures)
        with pytest.raises(ValueError, match=rf"{case}: a \w+ .* expected the tensors \[{re.escape(repr(drop[0]))}"):
            checkpoints.config_from_checkpoint(directory)
        shutil.rmtree(directory)


def test_an_unused_pooler_in_a_classifier_file_is_ignored_as_transformers_does(tmp_path, caplog):
    directory = _copy(tmp_path)
    tensors = read_safetensors(directory / "model.safetensors")
    width = tensors["vit.embeddings.cls_token"].shape[-1]
    rng = np.random.default_rng(0)
    tensors["vit.pooler.dense.weight"] = rng.normal(size=(width, width)).astype(np.float32)
    tensors["vit.pooler.dense.bias"] = rng.normal(size=(width,)).astype(np.float32)
    write_safetensors(directory / "model.safetensors", tensors)
    model = keras_vit.ViT.from_checkpoint(directory, classifier_activation=None)
    inputs, outputs = _io("vit_classifier")
    np.testing.assert_allclose(np.asarray(model(inputs)), outputs, atol=1e-4)
    assert "['vit.pooler.dense.bias', 'vit.pooler.dense.weight'] are unused" in caplog.text


def test_writing_refuses_a_non_empty_directory_and_non_finite_weights(tmp_path, caplog):
    small = dict(patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1, image_size=32)
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text("another model's")
    with pytest.raises(ValueError, match=r"A transformers model directory is written into a new or empty directory; "
                                         r".*other holds \['config\.json'\]\. Nothing was written"):
        checkpoints.save_transformers(keras_vit.ViT(**small, classes=3), str(other))
    assert os.listdir(other) == ["config.json"] and (other / "config.json").read_text() == "another model's"
    model = keras_vit.ViT(**small, classes=3)
    model.weights[0].assign(np.full(model.weights[0].shape, np.nan))
    with pytest.raises(ValueError, match=r"NaN or infinite values .* nothing was written to .*nan"):
        checkpoints.save_transformers(model, str(tmp_path / "nan"))
    assert not os.path.exists(tmp_path / "nan")
    # A headless model's ViTModel: transformers would compute a pooler_output the model never had.
    checkpoints.save_transformers(keras_vit.ViT(**small, classes=0), str(tmp_path / "headless"))
    assert "written as ViTModel without pooler.dense" in caplog.text
