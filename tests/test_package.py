"""The package's names load on first use, and its Keras classes register whenever Keras comes."""

import pathlib
import subprocess
import sys

import keras
import pytest

import keras_vit

ROOT = pathlib.Path(__file__).parents[1]


@pytest.mark.parametrize("name", keras_vit.__all__)
def test_every_public_name_resolves_and_is_listed(name):
    assert getattr(keras_vit, name) is not None
    assert name in dir(keras_vit)


def test_names_are_their_modules_objects():
    from keras_vit import ViT_B16, model, pretrained

    assert ViT_B16 is model.ViT_B16 and keras_vit.ViTConfig is keras_vit.config.ViTConfig
    assert pretrained.__name__ == "keras_vit.checkpoints.pretrained"
    with pytest.raises(AttributeError, match="module 'keras_vit' has no attribute 'ViT_Z99'"):
        keras_vit.ViT_Z99  # noqa: B018


@pytest.mark.parametrize("statement", ["import keras_vit\nimport keras", "import keras\nimport keras_vit"])
def test_a_keras_vit_file_loads_whichever_is_imported_first(tmp_path, statement):
    """`keras.models.load_model` finds the classes of a keras_vit `.keras` file (registered on import)."""
    path = tmp_path / "m.keras"
    keras_vit.ViT(patch_size=4, hidden_size=16, mlp_dim=32, num_heads=2, num_layers=1, image_size=8,
                  classes=3, classifier="gap").save(path)
    probe = f"{statement}\nprint(type(keras.models.load_model({str(path)!r})).__name__)"
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.split() == ["ViTModel"], result.stderr[-2000:]


def test_keras_classes_are_registered_in_this_process():
    assert keras.saving.get_registered_object("keras_vit>ViTModel") is keras_vit.ViTModel
