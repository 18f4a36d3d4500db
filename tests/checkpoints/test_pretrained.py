import concurrent.futures
import functools
import http.server
import json
import logging
import os
import pathlib
import socket
import subprocess
import sys
import threading
import urllib.parse

import numpy as np
import pytest

import keras_vit
from keras_vit import checkpoints
from keras_vit.checkpoints import pretrained
from keras_vit.variants import decode_variant
from tests.layer_checks import randomize_weights
from tests.processes import unreachable_network

FIXTURES = pathlib.Path(__file__).parents[1] / "fixtures"
DOCS = pathlib.Path(__file__).parents[2] / "docs" / "PRETRAINED.md"


def test_every_name_resolves_to_a_well_formed_official_url():
    entries = pretrained.table()
    assert len(entries) >= 40
    for name, e in entries.items():
        fields = decode_variant(e.variant)  # the variant exists
        url = urllib.parse.urlparse(e.url)
        assert (url.scheme, url.netloc) == ("https", "storage.googleapis.com"), name
        assert url.path.startswith("/vit_models/") and url.path.endswith(".npz"), name
        assert e.gs_path.startswith("gs://vit_models/") and " " not in e.url, name
        assert fields.replace(image_size=e.image_size).grid_size, name  # the size divides into tokens
        assert e.classes in (1000, 21843) and e.license == "Apache-2.0", name
        assert pretrained.resolve(e.variant, e.tag) is e
        if e.top1 is not None:
            assert 70 < e.top1 < 90 and e.top1_source, name


def test_the_traps_are_recorded():
    table = pretrained.table()
    old = table["ViT-B/16:imagenet21k"]
    assert old.zeroed_head and old.representation_size == 768 and old.classes == 21843
    augreg = table["ViT-B/16:augreg_in21k"]
    assert not augreg.zeroed_head and augreg.representation_size is None and augreg.classes == 21843
    for variant in ("Ti/16", "S/16", "S/32", "B/16", "B/32", "L/16", "R+Ti/16", "R26+S/32"):
        assert pretrained.resolve(variant, "augreg_in21k_ft_in1k").classes == 1000
    assert table["ViT-B/16:imagenet21k+imagenet2012"].image_size == 384


def test_unknown_name_lists_what_exists():
    with pytest.raises(ValueError,
                       match=r"No pretrained weights named 'imagenet' for ViT-B/16; available: \[.*'augreg_in21k'"):
        pretrained.resolve("B/16", "imagenet")


def test_docs_table_is_current():
    assert pretrained.markdown_table() in DOCS.read_text()


@pytest.fixture
def server(tmp_path):
    """A static file server on 127.0.0.1 for `tmp_path/site`."""
    site = tmp_path / "site" / "vit_models" / "augreg"
    site.mkdir(parents=True)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "site"))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield site, f"http://127.0.0.1:{httpd.server_address[1]}/vit_models/augreg/"
    httpd.shutdown()
    httpd.server_close()


def test_fetch_downloads_once_into_the_keras_cache(server, tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "home"))
    site, base = server
    (site / "token.npz").write_bytes((FIXTURES / "token.npz").read_bytes())
    path = pretrained.fetch(base + "token.npz")
    port = urllib.parse.urlparse(base).port
    assert pathlib.Path(path) == (tmp_path / "home" / "vit_models" / f"127.0.0.1_{port}" / "vit_models" / "augreg"
                                  / "token.npz")
    assert pathlib.Path(path).read_bytes() == (FIXTURES / "token.npz").read_bytes()
    (site / "token.npz").unlink()  # the second call must not need the server
    assert pretrained.fetch(base + "token.npz") == path


def test_offline_failure_says_what_to_download_and_where(tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "home"))
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/vit_models/imagenet21k/ViT-B_16.npz"
    target = pretrained.cache_path(url)
    with pytest.raises(checkpoints.WeightsUnavailable) as error:
        pretrained.fetch(url, timeout=5)
    assert url in str(error.value) and str(target) in str(error.value)
    assert isinstance(error.value, OSError) and isinstance(error.value, ValueError)  # what callers caught before
    assert error.value.__cause__ is None and error.value.__suppress_context__  # the reason is in the message
    assert not list(target.parent.glob("*"))  # no partial file left behind


# Named weights offline, as a user and the trainer ask for them (the trainer resolves the name to its URL, which
# `ViT(weights=)` fetches); last, the same call uncaught, for the traceback a user sees.
OFFLINE = """
import json, keras_vit
from keras_vit import checkpoints

def message(call):
    try:
        call()
    except checkpoints.WeightsUnavailable as error:
        return str(error), error.__cause__ is None and error.__suppress_context__

url = checkpoints.resolve_weights("augreg_in21k", "Ti/16").location
named = message(lambda: keras_vit.ViT_Ti16(weights="augreg_in21k"))
trainer = message(lambda: keras_vit.ViT(keras_vit.decode_variant("Ti/16"), weights=url, classes=10))
print(json.dumps(dict(url=url, cache=str(checkpoints.pretrained.cache_path(url)), messages=[named, trainer])))
keras_vit.ViT_Ti16(weights="augreg_in21k")
"""


def test_named_weights_offline_say_in_three_lines_what_to_fetch_where_to_put_it_and_what_to_pass(tmp_path):
    env = unreachable_network({**os.environ, "KERAS_HOME": str(tmp_path / "home"), "TF_CPP_MIN_LOG_LEVEL": "3"})
    result = subprocess.run([sys.executable, "-c", OFFLINE], env=env, cwd=tmp_path, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 1, result.stderr[-2000:]
    found = json.loads(result.stdout.splitlines()[-1])
    assert found["url"].startswith(pretrained.BUCKET)  # the real URL, refused by the proxy as offline
    for message, unchained in found["messages"]:
        assert len(message.splitlines()) <= 3 and unchained, message
        assert message.startswith(f"Could not download ViT-Ti/16:augreg_in21k from {found['url']} (") and \
            "Connection refused" in message, message
        assert f"put it at {found['cache']}, where keras_vit looks first" in message
        assert all(way in message for way in ("weights=PATH", "--pretrained=PATH", "--model=PATH")), message
    # Uncaught: the message under a traceback of keras_vit's own frames, no chain of urllib's.
    assert "WeightsUnavailable: Could not download ViT-Ti/16:augreg_in21k" in result.stderr
    assert "direct cause" not in result.stderr and "During handling" not in result.stderr, result.stderr
    assert result.stderr.count("Traceback") == 1 and len(result.stderr.splitlines()) < 30, result.stderr
    assert not (tmp_path / "home" / "vit_models" / "augreg").exists() or \
        not list((tmp_path / "home" / "vit_models" / "augreg").iterdir())


def test_a_download_cut_short_is_not_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "home"))
    listener = socket.create_server(("127.0.0.1", 0))

    def answer_a_quarter():  # announces 4000 bytes, sends 1000, closes
        connection, _ = listener.accept()
        with connection:
            connection.recv(65536)
            connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 4000\r\n\r\n" + b"P" * 1000)

    thread = threading.Thread(target=answer_a_quarter, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/vit_models/imagenet21k/ViT-B_16.npz"
    with listener, pytest.raises(OSError, match="after 1000 of 4000 bytes") as error:
        pretrained.fetch(url, timeout=5)
    thread.join()
    target = pretrained.cache_path(url)
    assert str(target) in str(error.value)
    assert not list(target.parent.glob("*"))  # neither the cut file nor a partial one


def test_the_cache_keeps_apart_what_other_servers_name_alike(tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    official = pretrained.cache_path(pretrained.BUCKET + "augreg/Ti_16.npz")
    assert official == tmp_path / "vit_models" / "augreg" / "Ti_16.npz"  # the documented layout
    urls = [pretrained.BUCKET + "augreg/Ti_16.npz?generation=2", "http://127.0.0.1:8000/vit_models/augreg/Ti_16.npz",
            "http://127.0.0.1:8001/vit_models/augreg/Ti_16.npz", "https://example.com/exp/model.npz",
            "https://mirror.example.com/exp/model.npz", "https://example.com/get?id=1", "https://example.com/get?id=2"]
    paths = [pretrained.cache_path(url) for url in urls]
    assert len({official, *paths}) == len(urls) + 1
    assert paths[3] == tmp_path / "vit_models" / "example.com" / "exp" / "model.npz"


def test_a_body_cut_short_without_a_length_is_an_offline_error(tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "home"))
    listener = socket.create_server(("127.0.0.1", 0))

    def answer_one_chunk():  # chunked, then closes before the last chunk: http.client's IncompleteRead
        connection, _ = listener.accept()
        with connection:
            connection.recv(65536)
            connection.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n" + b"P" * 16 + b"\r\n")

    thread = threading.Thread(target=answer_one_chunk, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/w.npz"
    with listener, pytest.raises(OSError, match=r"Could not download .*IncompleteRead") as error:
        pretrained.fetch(url, timeout=5)
    thread.join()
    assert str(pretrained.cache_path(url)) in str(error.value)
    assert not list(pretrained.cache_path(url).parent.glob("*"))


def test_downloads_at_once_of_one_file_each_write_their_own_part(server, tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "home"))
    site, base = server
    (site / "token.npz").write_bytes((FIXTURES / "token.npz").read_bytes())
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        paths = list(pool.map(lambda _: pretrained.fetch(base + "token.npz"), range(8)))
    assert len(set(paths)) == 1 and pathlib.Path(paths[0]).read_bytes() == (FIXTURES / "token.npz").read_bytes()
    assert [path.name for path in pathlib.Path(paths[0]).parent.iterdir()] == ["token.npz"]


def test_named_weights_load_from_the_cache(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "home"))
    entry = pretrained.resolve("Ti/16", "augreg_in21k_ft_in1k")
    source = keras_vit.ViT_Ti16(classifier_activation=None)
    randomize_weights(source, scale=0.05)
    target = pretrained.cache_path(entry.url)
    target.parent.mkdir(parents=True)
    checkpoints.save_npz(source, target)
    model = keras_vit.ViT_Ti16(weights="augreg_in21k_ft_in1k", classifier_activation=None)
    assert model.input_shape == (None, 224, 224, 3) and model.output_shape == (None, 1000)
    images = np.random.default_rng(0).uniform(-1, 1, (1, 224, 224, 3)).astype("float32")
    np.testing.assert_allclose(np.asarray(model(images)), np.asarray(source(images)), atol=1e-5)
    # Fine-tuning: another resolution and class count from the same file.
    with caplog.at_level(logging.INFO):
        tuned = keras_vit.ViT_Ti16(weights="augreg_in21k_ft_in1k", classes=10, image_size=288)
    assert tuned.get_layer("position_embedding").embedding.shape == (1, 1 + 18 * 18, 192)
    assert not tuned.get_layer("head").kernel.numpy().any()
    assert "resized" in caplog.text
    restarts = [r for r in caplog.records if "at zero" in r.getMessage()]
    assert len(restarts) == 1 and restarts[0].levelname == "WARNING", caplog.text
    assert "head (192, 1000) does not fit" in restarts[0].getMessage()
    assert "head (192, 10) starts at zero" in restarts[0].getMessage()


def test_the_weights_url_form_downloads_then_loads(server, tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "home"))
    site, base = server
    (site / "token.npz").write_bytes((FIXTURES / "token.npz").read_bytes())
    model = keras_vit.ViT(patch_size=8, hidden_size=64, mlp_dim=128, num_heads=4, num_layers=2,
                          image_size=32, classes=10, classifier_activation=None, weights=base + "token.npz")
    io = np.load(FIXTURES / "token_io.npz")
    np.testing.assert_allclose(np.asarray(model(io["images"])), io["logits"], atol=1e-4)
