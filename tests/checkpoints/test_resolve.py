"""`keras_vit.checkpoints.resolve_weights`: the one place that tells a pretrained name from a file, and the formats."""

import pathlib
import re

import pytest

import keras_vit
from keras_vit import checkpoints
from keras_vit.checkpoints import pretrained, resolve_weights, weights_kind

FIXTURES = pathlib.Path(__file__).parents[1] / "fixtures"


@pytest.mark.parametrize("weights, kind", [
    ("ViT-B_16.npz", "file"),
    (FIXTURES / "token.npz", "file"),
    ("gs://vit_models/augreg/Ti_16.npz", "file"),
    ("https://storage.googleapis.com/vit_models/augreg/Ti_16.npz", "url"),
    ("http://127.0.0.1:8000/model.safetensors", "url"),
    ("weights/model.safetensors", "file"),
    (FIXTURES / "timm" / "augreg", "directory"),
    ("run/model.weights.h5", "keras_weights"),
    ("imagenet21k", "pretrained"),
    ("no/such/directory", "pretrained"),
])
def test_each_form_of_weights_is_one_kind(weights, kind):
    assert weights_kind(weights) == kind
    if kind != "pretrained":
        resolved = resolve_weights(weights)
        assert (resolved.kind, resolved.location, resolved.entry) == (kind, str(weights), None)
        assert resolved.local == ("://" not in str(weights))


def test_a_name_resolves_to_its_variants_entry_and_needs_a_variant():
    resolved = resolve_weights("augreg_in21k_ft_in1k", "Ti/16")
    entry = pretrained.resolve("Ti/16", "augreg_in21k_ft_in1k")
    assert (resolved.kind, resolved.location, resolved.entry) == ("pretrained", entry.url, entry)
    assert not resolved.local
    with pytest.raises(ValueError, match="in a named builder such as ViT_B16.*received weights='imagenet'"):
        resolve_weights("imagenet")
    with pytest.raises(ValueError, match="No pretrained weights named 'imagenet' for ViT-Ti/16; available: "):
        resolve_weights("imagenet", "Ti/16")


@pytest.mark.parametrize("weights", [None, "", 3, ["a.npz"]])
def test_weights_that_are_no_path_nor_name_are_refused(weights):
    with pytest.raises(ValueError, match=re.escape(f"received weights={weights!r}")):
        weights_kind(weights)


def test_a_checkpoint_is_read_by_the_format_that_matches_it():
    assert checkpoints.checkpoint_format(FIXTURES / "token.npz") == (checkpoints.official, str(FIXTURES / "token.npz"))
    directory = FIXTURES / "timm" / "augreg"
    assert checkpoints.checkpoint_format(directory) == (checkpoints.timm, str(directory))
    for not_a_checkpoint in ("run/model.weights.h5", "imagenet21k"):
        expected = rf"A checkpoint must be .*an official '.npz'.*received '{not_a_checkpoint}'"
        with pytest.raises(ValueError, match=expected):
            checkpoints.config_from_checkpoint(not_a_checkpoint)


def test_every_format_has_what_the_package_recipe_asks():
    # keras_vit/checkpoints/__init__.py: adding a format is one module with these names and one line in FORMATS.
    for module in checkpoints.FORMATS:
        assert isinstance(module.DESCRIPTION, str) and module.DESCRIPTION
        for name in ("matches", "read", "read_arrays"):
            assert callable(getattr(module, name)), (module.__name__, name)
    config, arrays = checkpoints.official.read(FIXTURES / "token.npz")
    stated, same = checkpoints.official.read_arrays(FIXTURES / "token.npz")
    assert stated is None and sorted(same) == sorted(arrays)  # a released file states no configuration
    assert config == keras_vit.config_from_checkpoint(FIXTURES / "token.npz")
    stated, _ = checkpoints.timm.read_arrays(FIXTURES / "timm" / "augreg")
    assert stated == keras_vit.config_from_checkpoint(FIXTURES / "timm" / "augreg")  # its config.json states one


def test_the_checkpoints_package_imports_no_model():
    """Imports run one way: keras_vit.model imports the checkpoints package, which builds no model
    (`ViT.from_checkpoint` lives in keras_vit.model)."""
    package = pathlib.Path(checkpoints.__file__).parent
    imports_model = r"^\s*(from keras_vit\.model import|import keras_vit\.model|from keras_vit import .*\bmodel\b)"
    importing = [path.name for path in package.glob("*.py") if re.search(imports_model, path.read_text(), re.MULTILINE)]
    assert not importing
    assert keras_vit.ViT.from_checkpoint is keras_vit.model.from_checkpoint
    assert not hasattr(checkpoints, "from_checkpoint")


def test_a_folder_never_shadows_a_registered_name(tmp_path, monkeypatch):
    import shutil

    shutil.copytree(FIXTURES / "timm" / "augreg", tmp_path / "imagenet21k")  # the layout docs/checkpoints.md uses
    monkeypatch.chdir(tmp_path)
    assert weights_kind("imagenet21k") == "pretrained"
    assert weights_kind("./imagenet21k") == "directory"


@pytest.mark.parametrize("text, path", [
    ("./hf/deit_tiny_patch16_224", True), ("/data/w", True), ("~/w", True), ("a/b/c", True), ("ViT-B_16.npz", True),
    ("run/model.weights.h5", True), ("m.keras", True), ("w.safetensors", True),
    ("hf/deit_tiny_patch16_224", False), ("timm/vit_base_patch16_224.augreg2_in21k_ft_in1k", False),
    ("imagenet21k", False), ("augreg_in21k_ft_in1k", False),
])
def test_what_can_only_be_a_path(text, path):
    # A plain `org/name` may be a folder or a hub id (whose errors then say no such path exists); a hub id may hold
    # dots, so only checkpoint suffixes make a path.
    assert checkpoints.resolve.looks_like_path(text) == path


def test_a_missing_path_is_said_to_be_missing_before_it_is_taken_for_a_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    cases = [
        ("./hf/deit_tiny_patch16_224", lambda w: keras_vit.ViT.from_checkpoint(w), "relative to"),
        ("./hf/deit_tiny_patch16_224", lambda w: keras_vit.ViT_Ti16(weights=w), "relative to"),  # not "no name"
        ("a/b/c", lambda w: keras_vit.ViT(keras_vit.decode_variant("Ti/16"), weights=w), "relative to"),
        ("a/b/c", lambda w: resolve_weights(w, "Ti/16"), "relative to"),
        ("missing.npz", lambda w: keras_vit.config_from_checkpoint(w), "relative to"),  # was numpy's FileNotFoundError
        (str(tmp_path / "w.safetensors"), lambda w: keras_vit.ViT.from_checkpoint(w), None),
        ("m.weights.h5", lambda w: keras_vit.ViT(keras_vit.decode_variant("Ti/16"), weights=w), "relative to"),
        ("~/w.npz", lambda w: keras_vit.ViT.from_checkpoint(w), "`~` is not expanded here"),
    ]
    for weights, call, where in cases:
        with pytest.raises(ValueError) as error:
            call(weights)
        message = str(error.value)
        assert message.startswith(f"no such file or directory: {weights!r}"), (weights, message)
        assert where is None or where in message, message
    # A folder that exists but holds no checkpoint is no missing path: what it lacks is named.
    with pytest.raises(ValueError, match=r"./empty is not a Hugging Face timm model directory"):
        keras_vit.ViT.from_checkpoint("./empty")
    # Forms are unchanged: a missing file still resolves (the trainer says "no such file" in its own words).
    assert resolve_weights("missing.npz").kind == "file"
