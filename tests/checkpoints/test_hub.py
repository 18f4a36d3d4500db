"""Hugging Face hub ids: read from huggingface_hub's cache, offline (`HF_HUB_OFFLINE=1`), never the network.

The cache is populated by hand in the library's own layout
(`models--ORG--NAME/refs/main`, `snapshots/<commit>/`) with a transformers
fixture; each command runs in a process of its own, since huggingface_hub
reads its environment when imported.
"""

import http.server
import os
import shutil
import subprocess
import sys
import threading

import pytest

from keras_vit.checkpoints import hub
from keras_vit.checkpoints.resolve import weights_kind
from tests.processes import run_together, unreachable_network

pytest.importorskip("huggingface_hub")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "hf", "vit_classifier")
COMMIT = "0123456789abcdef0123456789abcdef01234567"

LOAD = """
import sys, numpy as np, keras_vit
model = keras_vit.ViT.from_checkpoint(sys.argv[1], classifier_activation=None)
with np.load(sys.argv[2]) as io:
    print("max-diff", float(np.abs(np.asarray(model(io["inputs"])) - io["outputs"]).max()))
"""


# The trainer's check of --pretrained: a hub id passes it (and its conventions are read) from the cache.
VALIDATE = """
import sys, keras_vit
from trainers import recipes
config = keras_vit.config_from_checkpoint(sys.argv[1])
recipe = recipes.validate(recipes.RECIPES["vit_finetune"].replace(
    **config.to_dict(), pretrained=sys.argv[1], dataset="keras_vit_digits", train_split="train", eval_split="test"))
print("validated", recipe.pretrained)
"""


def _env(cache):
    return {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "PYTHONPATH": ROOT}


def test_hub_ids_are_told_from_paths_and_names(tmp_path, monkeypatch):
    assert weights_kind("google/vit-base-patch16-224") == "hub"
    assert weights_kind("augreg_in21k_ft_in1k") == "pretrained"
    assert hub.is_hub_id("org/name")
    (tmp_path / "org" / "name").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)  # "org/name" now names a local directory, which wins
    assert not hub.is_hub_id("org/name")


def test_a_cached_hub_id_loads_offline_and_an_uncached_one_says_what_to_download(tmp_path):
    snapshot = tmp_path / "cache" / "models--testorg--tiny-vit" / "snapshots" / COMMIT
    shutil.copytree(FIXTURE, snapshot)
    (tmp_path / "cache" / "models--testorg--tiny-vit" / "refs").mkdir()
    (tmp_path / "cache" / "models--testorg--tiny-vit" / "refs" / "main").write_text(COMMIT)
    io = os.path.join(ROOT, "tests", "fixtures", "hf", "vit_classifier_io.npz")
    cached, missing, validated = run_together([[sys.executable, "-c", LOAD, "testorg/tiny-vit", io],
                                               [sys.executable, "-c", LOAD, "testorg/not-cached", io],
                                               [sys.executable, "-c", VALIDATE, "testorg/tiny-vit"]],
                                              env=_env(tmp_path / "cache"), cwd=tmp_path)
    assert cached.returncode == 0, cached.stderr[-2000:]
    assert float(cached.stdout.split("max-diff")[1]) < 1e-4
    assert missing.returncode != 0
    message = missing.stderr[missing.stderr.index("WeightsUnavailable: ") + len("WeightsUnavailable: "):].strip()
    assert len(message.splitlines()) <= 3 and "direct cause" not in missing.stderr, missing.stderr[-3000:]
    assert message.startswith("Could not download the Hugging Face hub id 'testorg/not-cached' from "
                              "https://huggingface.co/testorg/not-cached (HF_HUB_OFFLINE is set; it is not in the "
                              "Hugging Face cache, and no local file or folder has that name)"), message
    assert f"`hf download testorg/not-cached` fills into {tmp_path / 'cache'}, where keras_vit looks first" in message
    assert "`hf download testorg/not-cached --local-dir PATH`" in message and "weights=PATH" in message
    assert validated.returncode == 0 and "validated testorg/tiny-vit" in validated.stdout, validated.stderr[-2000:]


def test_without_huggingface_hub_the_error_says_what_to_download(tmp_path):
    # A stand-in package that fails to import, as an uninstalled one does.
    blocker = tmp_path / "huggingface_hub"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('no huggingface_hub here')\n")
    env = {**_env(tmp_path), "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    code = "from keras_vit.checkpoints import hub; hub.snapshot('google/vit-base-patch16-224')"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "needs huggingface_hub (pip install 'keras-vision-transformer[hub]' (in a checkout: pip install -e " \
           "'.[hub]'))" in result.stderr
    assert "https://huggingface.co/google/vit-base-patch16-224/tree/main" in result.stderr


class _NoSuchRepo(http.server.BaseHTTPRequestHandler):
    """The hub's answer to a repository it does not have (`X-Error-Code: RepoNotFound`), to every request."""

    def do_GET(self):  # http.server calls it by this name
        self.send_response(404)
        self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


def test_a_missing_folder_taken_for_a_hub_id_is_said_to_be_missing(tmp_path):
    # `hf/deit_tiny_patch16_224` is the folder docs/checkpoints.md downloads into; here it was never made, so it
    # reads as a hub id: a hub that has no such repository, then no network at all.
    hub_server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NoSuchRepo)
    threading.Thread(target=hub_server.serve_forever, daemon=True).start()
    code = "import keras_vit; keras_vit.ViT.from_checkpoint('hf/deit_tiny_patch16_224')"
    base = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "cache"), "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "3"}
    base.pop("HF_HUB_OFFLINE", None)
    try:
        unknown, offline = run_together(
            [[sys.executable, "-c", code]] * 2, cwd=tmp_path, timeout=300,
            envs=[{**base, "HF_ENDPOINT": f"http://127.0.0.1:{hub_server.server_address[1]}"},
                  unreachable_network(base)])
    finally:
        hub_server.shutdown()
        hub_server.server_close()
    assert unknown.returncode != 0
    assert "ValueError: no such file or directory: 'hf/deit_tiny_patch16_224', nor a Hugging Face hub repository" \
        in unknown.stderr, unknown.stderr[-3000:]
    assert offline.returncode != 0
    assert "Connection refused; it is not in the Hugging Face cache, and no local file or folder has that name" \
        in offline.stderr, offline.stderr[-3000:]
