"""keras_vit turns TensorFlow's oneDNN kernels on for every x86 CPU (keras_vit._onednn), in fresh processes:
TensorFlow reads the setting once, as it loads."""

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from keras_vit import _onednn

ROOT = Path(__file__).resolve().parents[1]
X86 = platform.machine().lower() in _onednn._X86

# What TensorFlow ended up with, and whether a first training step warned.
PROBE = """
import warnings
{imports}
from tensorflow.python.util import _pywrap_util_port
model = keras_vit.ViT(patch_size=8, hidden_size=16, mlp_dim=32, num_heads=2, num_layers=1, image_size=8, classes=2)
model.compile("sgd", "sparse_categorical_crossentropy")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    model.train_on_batch(np.zeros((2, 8, 8, 3), "float32"), np.zeros(2))
    model.train_on_batch(np.zeros((2, 8, 8, 3), "float32"), np.zeros(2))
print(os.environ.get("TF_ENABLE_ONEDNN_OPTS"), _pywrap_util_port.IsMklEnabled(),
      sum("oneDNN CPU kernels are off" in str(w.message) for w in caught))
"""


def _probe(imports, setting):
    env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    env.update({"KERAS_BACKEND": "tensorflow", **({} if setting is None else {"TF_ENABLE_ONEDNN_OPTS": setting})})
    code = PROBE.format(imports=imports)
    result = subprocess.run([sys.executable, "-c", "import os\nimport numpy as np\n" + code], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.split()[-3:]


@pytest.mark.skipif(not X86, reason="oneDNN's TensorFlow kernels are x86's; elsewhere keras_vit leaves the setting")
def test_importing_keras_vit_first_turns_the_kernels_on_and_a_choice_is_kept():
    assert _probe("import keras_vit", None) == ["1", "True", "0"]
    assert _probe("import keras_vit", "0") == ["0", "False", "0"]  # the user's choice, and no warning for it


@pytest.mark.skipif(not X86, reason="oneDNN's TensorFlow kernels are x86's; elsewhere keras_vit leaves the setting")
def test_tensorflow_loaded_first_keeps_its_own_choice_and_warns_once_where_it_is_off():
    # TensorFlow's default on this CPU, read before keras_vit could set anything; Keras imports TensorFlow.
    setting, enabled, warned = _probe("import keras\nimport keras_vit", None)
    assert setting == "None" and warned == ("0" if enabled == "True" else "1")
    # Off where TensorFlow loaded, as on an AVX2 CPU: the setting gone before keras_vit looks, as if never made.
    unset_after_loading = "import keras\ndel os.environ['TF_ENABLE_ONEDNN_OPTS']\nimport keras_vit"
    assert _probe(unset_after_loading, "0") == ["None", "False", "1"]  # one warning over two steps


def test_prefer_onednn_sets_only_an_unset_variable_before_tensorflow_loads(monkeypatch):
    monkeypatch.setattr(_onednn, "_state", dict(_onednn._state))  # what this process's import recorded, kept
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)
    environ = {}
    assert _onednn.prefer_onednn(environ) and environ == {"TF_ENABLE_ONEDNN_OPTS": "1"}
    environ = {"TF_ENABLE_ONEDNN_OPTS": "0"}
    assert not _onednn.prefer_onednn(environ) and environ == {"TF_ENABLE_ONEDNN_OPTS": "0"}
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    assert not _onednn.prefer_onednn(environ := {}) and environ == {}
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setitem(sys.modules, "tensorflow", object())  # loaded already: too late to choose
    assert not _onednn.prefer_onednn(environ := {}) and environ == {}


def test_a_training_step_asks_tensorflow_once_per_process(monkeypatch):
    # make_train_function runs on every train_on_batch: after the first look, nothing is asked again.
    from keras_vit.layers import keras_internals

    asked = []
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(_onednn, "_state", {"chosen": None, "looked": False})
    monkeypatch.setattr(keras_internals, "tensorflow_onednn_enabled", lambda: asked.append(1) or False)
    with pytest.warns(UserWarning, match="oneDNN CPU kernels are off"):
        assert _onednn.warn_if_off()
    assert not _onednn.warn_if_off() and len(asked) == 1
