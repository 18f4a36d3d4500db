"""SavedModel export, proven through TF Serving's own loader (TensorFlow's C API)."""

import io
import json
import os
import pathlib
import re
import struct
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

import keras_vit
from export import capi, saved_model, serving_check
from export import preprocessing as prep
from tests.layer_checks import randomize_weights
from tests.processes import run_together

ROOT = pathlib.Path(__file__).parents[2]
LABELS = ["cat", "dog", "bird"]
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module")
def model():
    model = keras_vit.ViT(patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2, image_size=16,
                          classes=3, classifier_activation=None)
    randomize_weights(model, scale=0.3)
    return model


@pytest.fixture(scope="module")
def exported(model, tmp_path_factory):
    base = tmp_path_factory.mktemp("serving")
    return saved_model.export_saved_model(model, base, name="vit", labels=LABELS, top_k=2)


@pytest.fixture(scope="module")
def served(exported):
    """The export as TF Serving holds it: loaded by the C API's LoadSavedModel."""
    session = capi.SavedModelSession(exported)
    yield session
    session.close()


def encode(pixels, format, **options):
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=format, **options)
    return buffer.getvalue()


def photo(height=20, width=28, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def encoded_images():
    """A JPEG and a PNG of other sizes than the model's."""
    drawing = np.repeat(np.linspace(0, 255, 24, dtype=np.uint8)[None, :, None], 18, 0).repeat(3, 2)
    return [tf.io.encode_jpeg(photo()).numpy(), tf.io.encode_png(drawing).numpy()]


def model_inputs(pixels):
    """Decoded RGB pixels as the export must feed them: resized to 16x16 and rounded as uint8, in [-1, 1]."""
    return tf.clip_by_value(tf.round(tf.image.resize(pixels, (16, 16))), 0, 255) / 127.5 - 1.0


def keras_probabilities(model, pixels):
    """What the export must compute from decoded RGB pixels: `model_inputs`, the model, softmax."""
    return tf.nn.softmax(model(tf.stack([model_inputs(p) for p in pixels]))).numpy()


def decoded(images):
    return [tf.io.decode_image(b, channels=3, expand_animations=False) for b in images]


def strings(*images):
    return np.array(images, dtype=object)


def test_a_request_is_what_the_trainer_evaluates(model, tmp_path):
    # Rounded after the resize, as the trainer's evaluation: the inputs the model's reported accuracy saw.
    import types

    from trainers import data

    path = saved_model.export_saved_model(model, tmp_path, name="cropped", crop_fraction=0.875, max_image_pixels=2000)
    session = capi.SavedModelSession(path)
    try:
        served = session.run("serving_default", images=strings(*encoded_images()))["probabilities"]
        # A 1 x 100 strip is 100 pixels, but 18 x 1829 once its short side is scaled for the crop: refused.
        strip = photo(1, 100)
        message = r"\[1 100\] \[would be resized to\] \[18 1829\] \[before its centre crop.*\[2000\] \[\(max_image"
        for signature, inputs in (("serving_default", dict(images=strings(encode(strip, "PNG")))),
                                  ("predict_pixels", dict(pixels=strip[None]))):
            with pytest.raises(capi.TFError, match=message) as error:
                session.run(signature, **inputs)
            assert error.value.code == 3
    finally:
        session.close()
    recipe = types.SimpleNamespace(model=model.vit_config, eval_crop_fraction=0.875)
    evaluated = tf.nn.softmax(model(tf.stack([data.eval_image(p, recipe) for p in decoded(encoded_images())])))
    np.testing.assert_allclose(served, evaluated, atol=1e-6)


def test_a_session_on_one_thread_answers_as_keras(model, exported):
    """`threads=`, TF Serving's intra-op flag, as the benchmark's served worker sets it: the same answers."""
    inputs = np.random.default_rng(3).uniform(-1, 1, (2, 16, 16, 3)).astype(np.float32)
    session = capi.SavedModelSession(exported, threads=1)
    try:
        answered = session.run("predict_float", inputs=inputs)["probabilities"]
    finally:
        session.close()
    logits = model.predict(inputs, verbose=0)
    expected = np.exp(logits - logits.max(-1, keepdims=True))
    np.testing.assert_allclose(answered, expected / expected.sum(-1, keepdims=True), atol=1e-5)


def test_tf_serving_layout_versions_and_overwrite(model, exported):
    assert exported.name == "1" and (exported / "saved_model.pb").exists() and (exported / "variables").is_dir()
    base = exported.parents[1]
    second = saved_model.export_saved_model(model, base, name="vit", top_k=1)
    assert second.name == "2"
    with pytest.raises(ValueError, match="Version 2 of 'vit' exists.*--overwrite"):
        saved_model.export_saved_model(model, base, name="vit", version=2)
    replaced = saved_model.export_saved_model(model, base, name="vit", version=2, top_k=3, overwrite=True)
    assert json.loads((replaced / "assets.extra" / saved_model.METADATA).read_text())["top_k"] == 3
    assert sorted(p.name for p in (base / "vit").iterdir()) == ["1", "2"]


def test_a_version_another_export_publishes_meanwhile_is_kept(model, tmp_path, monkeypatch):
    proven = serving_check.check

    def another_export_publishes_first(path, *args, **kwargs):
        result = proven(path, *args, **kwargs)
        (tmp_path / "vit" / "1").mkdir()
        (tmp_path / "vit" / "1" / "saved_model.pb").write_bytes(b"theirs")
        return result

    monkeypatch.setattr(serving_check, "check", another_export_publishes_first)
    with pytest.raises(ValueError, match="Version 1 appeared at .* while this export ran .* was kept"):
        saved_model.export_saved_model(model, tmp_path, name="vit")
    assert (tmp_path / "vit" / "1" / "saved_model.pb").read_bytes() == b"theirs"
    assert [p.name for p in (tmp_path / "vit").iterdir()] == ["1"]  # and no staging left


def test_signatures_as_the_cpp_loader_sees_them(served, exported):
    signatures = {name: (capi.describe(s.inputs), capi.describe(s.outputs))
                  for name, s in served.signatures.items() if not name.startswith("__")}
    classified = {"probabilities": "float32(None, 3)", "top_k_classes": "int32(None, 2)",
                  "top_k_scores": "float32(None, 2)", "top_k_labels": "string(None, 2)"}
    # Inputs declare any shape and check theirs when they run (saved_model._signature says why).
    assert signatures == {
        "serving_default": ({"images": "string(any shape)"}, classified),
        "predict_pixels": ({"pixels": "uint8(any shape)"}, classified),
        "predict_float": ({"inputs": "float32(any shape)"}, classified),
        "embeddings": ({"images": "string(any shape)"}, {"embeddings": "float32(None, 32)"}),
    }
    meta = json.loads((exported / "assets.extra" / saved_model.METADATA).read_text())
    assert meta["signatures"] == {"serving_default": {"images": [None]},
                                  "predict_pixels": {"pixels": [None, None, None, 3]},
                                  "predict_float": {"inputs": [None, 16, 16, 3]},
                                  "embeddings": {"images": [None]}}


@pytest.mark.parametrize("signature, value, message", [
    ("predict_float", np.zeros((16, 16, 3), np.float32), r"inputs must have shape \[N, 16, 16, 3\]; "
                                                         r"received shape\] \[16 16 3\]"),
    ("predict_float", np.zeros((1, 32, 32, 3), np.float32), r"inputs must have shape \[N, 16, 16, 3\]"),
    ("predict_pixels", np.zeros((1, 5, 5, 4), np.uint8), r"pixels must have shape \[N, any, any, 3\]"),
    ("predict_pixels", np.zeros((5, 5, 3), np.uint8), r"pixels must have shape \[N, any, any, 3\]"),
    ("serving_default", np.array([[b"x"]], object), r"images must have shape \[N\]; received shape\] \[1 1\]"),
])
def test_a_request_of_the_wrong_shape_is_an_invalid_argument_not_a_crash(served, signature, value, message):
    """A rank-3 float request used to abort the server process (a CHECK in the convolution)."""
    name = list(served.signatures[signature].inputs)[0]
    with pytest.raises(capi.TFError, match=message) as error:
        served.run(signature, **{name: value})
    assert error.value.code == 3


def test_predict_float_refuses_raw_pixels_naming_both_ranges(model, served):
    """Raw pixels (0-255) in the float signature were answered, confidently and wrongly."""
    pixels = tf.image.resize(tf.io.decode_png(encoded_images()[1]), (16, 16))[None].numpy()
    for raw in (pixels, np.full((1, 16, 16, 3), np.nan, np.float32)):
        with pytest.raises(capi.TFError, match=r"inputs must be scaled model inputs, in \[-1, 1\] .*"
                                               r"raw pixels go to predict_pixels.*received values from") as error:
            served.run("predict_float", inputs=raw)
        assert error.value.code == 3
    assert "[nan]" in str(error.value)  # the last one: NaN named as received
    # A resize's overshoot after scaling (a quarter of the range's width) is still the model's input.
    edge = np.full((2, 16, 16, 3), 1.45, np.float32)
    edge[1] = -1.45
    assert served.run("predict_float", inputs=edge)["probabilities"].shape == (2, 3)
    empty = served.run("predict_float", inputs=np.zeros((0, 16, 16, 3), np.float32))["probabilities"]
    assert empty.shape == (0, 3)


def test_cpp_loader_gives_the_keras_probabilities_and_labels(model, served):
    images = encoded_images()
    out = served.run("serving_default", images=strings(*images))
    expected = keras_probabilities(model, decoded(images))
    np.testing.assert_allclose(out["probabilities"], expected, atol=1e-5)
    best = expected.argmax(1)
    assert out["top_k_classes"][:, 0].tolist() == best.tolist()
    assert [row[0].decode() for row in out["top_k_labels"]] == [LABELS[i] for i in best]
    assert np.abs(expected - 1 / 3).max() > 0.05  # not a flat model


def test_pixels_embeddings_and_float_signatures_agree(model, served):
    png = encoded_images()[1]
    pixels = tf.io.decode_png(png)[None].numpy()
    by_bytes = served.run("serving_default", images=strings(png))["probabilities"]
    np.testing.assert_allclose(served.run("predict_pixels", pixels=pixels)["probabilities"], by_bytes, atol=1e-6)
    inputs = model_inputs(pixels).numpy()
    np.testing.assert_allclose(served.run("predict_float", inputs=inputs)["probabilities"], by_bytes, atol=1e-6)
    embeddings = served.run("embeddings", images=strings(png, png))["embeddings"]
    expected = keras_vit_features(model, inputs)
    np.testing.assert_allclose(embeddings, np.concatenate([expected] * 2), atol=1e-5)


def keras_vit_features(model, inputs):
    import keras

    return np.asarray(keras.Model(model.input, model.get_layer("pooling").output)(inputs))


def webp(pixels, **options):
    return encode(pixels, "WEBP", lossless=True, exact=True, **options)


def animated_webp():
    frames = [Image.fromarray(photo(20, 20, seed=k)) for k in range(4)]
    buffer = io.BytesIO()
    frames[0].save(buffer, format="WEBP", save_all=True, append_images=frames[1:], duration=100, lossless=True)
    return buffer.getvalue()


def test_every_format_the_decoder_knows_is_served(model, served):
    """Grayscale, RGBA and 16-bit PNG, GIF, BMP and WebP: the pixels a user sees, as RGB."""
    rgb = (photo(21, 17, seed=1) // 64 * 64).astype(np.uint8)  # few colours: a GIF keeps them exactly
    gray = rgb[..., 0]
    rgba = np.dstack([rgb, np.full(gray.shape, 200, np.uint8)])
    # Lossy WebP: the decoder's own pixels, whatever the encoder made of the colours (RGBA: its alpha dropped).
    lossy, rgba_lossy = encode(rgb, "WEBP"), encode(rgba, "WEBP")
    rgba_pixels = tf.io.decode_image(rgba_lossy, channels=0, expand_animations=False)
    assert rgba_pixels.shape[-1] == 4
    cases = {
        "gray PNG": (encode(gray, "PNG"), np.repeat(gray[..., None], 3, -1)),
        "RGBA PNG": (encode(rgba, "PNG"), rgb),
        "16-bit PNG": (tf.io.encode_png(tf.constant(rgb.astype(np.uint16) * 257)).numpy(), rgb),
        "GIF": (encode(rgb, "GIF"), rgb),
        "BMP": (encode(rgb, "BMP"), rgb),
        "WebP lossless": (webp(rgb), rgb),
        "RGBA WebP lossless": (webp(rgba), rgb),
        "WebP lossy": (lossy, decoded([lossy])[0]),
        "RGBA WebP lossy": (rgba_lossy, rgba_pixels[..., :3]),
    }
    layouts = [cases[name][0][12:16] for name in ("WebP lossless", "WebP lossy", "RGBA WebP lossy")]
    assert layouts == [b"VP8L", b"VP8 ", b"VP8X"]
    for name, (data, pixels) in cases.items():
        got = served.run("serving_default", images=strings(data))["probabilities"]
        np.testing.assert_allclose(got, keras_probabilities(model, [pixels]), atol=1e-5, err_msg=name)


def test_a_distilled_model_embeds_as_its_headless_self(tmp_path):
    deit = dict(patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1, image_size=16, distilled=True)
    model = keras_vit.ViT(**deit, classes=3)
    randomize_weights(model, scale=0.3)
    headless = keras_vit.ViT(**deit, include_top=False, weights=keras_vit.save_npz(model, tmp_path / "deit.npz"))
    session = capi.SavedModelSession(saved_model.export_saved_model(model, tmp_path, name="deit"))
    try:
        embeddings = session.run("embeddings", images=strings(*encoded_images()))["embeddings"]
    finally:
        session.close()
    expected = np.asarray(headless(tf.stack([model_inputs(p) for p in decoded(encoded_images())])))
    np.testing.assert_allclose(embeddings, expected, atol=1e-5)  # both tokens' mean, not the class token's alone


def test_a_grey_model_takes_every_format(tmp_path):
    # GIF and BMP decode only to colour; a one-channel model gets their grey.
    grey_model = keras_vit.ViT(patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1, image_size=16,
                               input_shape=(16, 16, 1), classes=3, classifier_activation=None)
    randomize_weights(grey_model, scale=0.3)
    session = capi.SavedModelSession(saved_model.export_saved_model(grey_model, tmp_path, name="grey"))
    grey = photo(21, 17, seed=4)[..., :1] // 64 * 64  # few levels: a GIF keeps them exactly
    try:
        for format in ("PNG", "JPEG", "GIF", "BMP", "WEBP"):
            data = encode(np.repeat(grey, 3, -1) if format in ("GIF", "BMP", "WEBP") else grey[..., 0], format,
                          **({"lossless": True} if format == "WEBP" else {}))
            pixels = tf.io.decode_image(data, channels=1, expand_animations=False) if format == "JPEG" else grey
            expected = tf.nn.softmax(grey_model(model_inputs(pixels)[None])).numpy()
            got = session.run("serving_default", images=strings(data))["probabilities"]
            np.testing.assert_allclose(got, expected, atol=1e-5, err_msg=format)
    finally:
        session.close()


def test_a_batch_mixing_sizes_and_formats_answers_as_its_elements(served):
    images = [*encoded_images(), encode(photo(40, 9, seed=2), "BMP"), encode(photo(7, 30, seed=3), "GIF")]
    batch = served.run("serving_default", images=strings(*images))["probabilities"]
    one_by_one = np.concatenate([served.run("serving_default", images=strings(i))["probabilities"] for i in images])
    np.testing.assert_allclose(batch, one_by_one, atol=1e-6)


def test_an_empty_batch_returns_empty_outputs_of_the_right_shapes(served):
    out = served.run("serving_default", images=np.empty([0], object))
    assert {k: v.shape for k, v in out.items()} == {
        "probabilities": (0, 3), "top_k_classes": (0, 2), "top_k_scores": (0, 2), "top_k_labels": (0, 2)}
    assert served.run("embeddings", images=np.empty([0], object))["embeddings"].shape == (0, 32)
    assert served.run("predict_pixels", pixels=np.zeros((0, 5, 5, 3), np.uint8))["probabilities"].shape == (0, 3)


@pytest.mark.parametrize("data, message", [
    (b"not an image", r"images element.*\b1\b.*is not a JPEG, PNG, GIF, BMP or WebP image"),
    (b"", r"images element.*\b1\b.*is not a JPEG, PNG, GIF, BMP or WebP image"),
    (b"II*\x00", r"images element.*\b1\b.*is not a JPEG, PNG, GIF, BMP or WebP image"),  # TIFF
    (b"RIFF\x00\x00\x00\x00WEBPVP8 ", r"images element.*\b1\b.*declares.*\b0\b.*pixels"),
    ("animated WebP", r"images element.*\b1\b.*is an animated WebP"),
    ("truncated JPEG", r"JPEG"),
    ("truncated PNG", r"PNG"),
    ("corrupt JPEG header", r"JPEG"),
])
def test_a_bad_element_is_an_invalid_argument_and_the_server_goes_on(served, data, message):
    good, png = encoded_images()
    data = {"truncated JPEG": good[: len(good) // 2], "truncated PNG": png[: len(png) - 30],
            "corrupt JPEG header": good[:4] + b"\x00" * 40, "animated WebP": animated_webp()}.get(data, data)
    with pytest.raises(capi.TFError, match=message) as error:
        served.run("serving_default", images=strings(good, data))
    assert error.value.code == 3  # INVALID_ARGUMENT, what TF Serving returns to the client
    assert served.run("serving_default", images=strings(good))["probabilities"].shape == (1, 3)


def test_an_image_declaring_too_many_pixels_is_refused_from_its_header(model, tmp_path):
    path = saved_model.export_saved_model(model, tmp_path, name="small", max_image_pixels=600)
    session = capi.SavedModelSession(path)
    try:
        rgba = np.dstack([photo(30, 21), np.full((30, 21), 200, np.uint8)])
        for image in (encode(photo(30, 21), "PNG"), encode(photo(30, 21), "JPEG"), encode(photo(30, 21), "BMP"),
                      encode(photo(30, 21) // 64 * 64, "GIF"), encode(photo(30, 21), "WEBP"), webp(photo(30, 21)),
                      encode(rgba, "WEBP")):  # WebP: VP8, VP8L, VP8X
            with pytest.raises(capi.TFError, match=r"images element.*\b0\b.*declares.*\b630\b.*pixels.*\b600\b"):
                session.run("serving_default", images=strings(image))
        assert session.run("serving_default", images=strings(encode(photo(20, 30), "PNG")))
        # An animated GIF decodes every frame: 4 frames of 20 x 20 declare 1600 pixels.
        frames = [Image.fromarray(photo(20, 20, seed=k) // 64 * 64) for k in range(4)]
        buffer = io.BytesIO()
        frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:], duration=100)
        with pytest.raises(capi.TFError, match=r"images element.*\b0\b.*declares.*\b1600\b.*pixels"):
            session.run("serving_default", images=strings(buffer.getvalue()))
        # The same without its frame-timing blocks (GIF89a's, optional), and one frame whose screen size in
        # the header says 10 x 10: the decoder follows the frames, so the check must too.
        plain = [Image.new("RGB", (20, 20), (k * 60, 0, 0)) for k in range(4)]
        buffer = io.BytesIO()
        plain[0].save(buffer, format="GIF", save_all=True, append_images=plain[1:], duration=100)
        untimed = re.sub(rb"\x21\xf9\x04.{4}\x00", b"", buffer.getvalue(), flags=re.S)
        assert untimed.count(b"\x21\xf9\x04") == 0 and tf.io.decode_gif(untimed).shape[0] == 4
        small_screen = bytearray(encode(photo(30, 21) // 64 * 64, "GIF"))
        small_screen[6:10] = struct.pack("<HH", 10, 10)
        for image, declared in ((untimed, 1600), (bytes(small_screen), 630)):
            with pytest.raises(capi.TFError, match=rf"images element.*\b0\b.*declares.*\b{declared}\b.*pixels"):
                session.run("serving_default", images=strings(image))
    finally:
        session.close()
    meta = json.loads((path / "assets.extra" / saved_model.METADATA).read_text())
    assert meta["preprocessing"]["max_image_pixels"] == 600


def test_a_process_serving_through_the_c_api_can_still_import_openssl(exported):
    """TensorFlow's libraries export BoringSSL's symbols; Python's OpenSSL modules loaded after them crashed."""
    script = ("import sys\nfrom export import capi\ncapi.without_tensorflow_runtime()\n"
              "session = capi.SavedModelSession(sys.argv[1])\n"
              "import hashlib, ssl, numpy.random\nprint(hashlib.sha256(b'vit').hexdigest()[:8])")
    result = subprocess.run([sys.executable, "-c", script, str(exported)], capture_output=True, text=True,
                            timeout=300, cwd=ROOT, env=ENV)
    assert result.returncode == 0 and result.stdout.split() == ["00352181"], (result.returncode, result.stderr[-2000:])


def test_a_12000_by_12000_jpeg_is_refused_in_bounded_memory(exported, tmp_path):
    """The server process' peak memory grows by less than the decoded image would take (432 MB)."""
    Image.new("RGB", (12000, 12000), (90, 120, 200)).save(tmp_path / "huge.jpg", quality=30)
    (tmp_path / "small.png").write_bytes(encoded_images()[1])
    script = (
        "import json, resource, sys, numpy as np\n"
        "from export import capi\n"
        "capi.without_tensorflow_runtime()\n"
        f"session = capi.SavedModelSession({str(exported)!r})\n"
        f"small = open({str(tmp_path / 'small.png')!r}, 'rb').read()\n"
        f"huge = open({str(tmp_path / 'huge.jpg')!r}, 'rb').read()\n"
        "session.run('serving_default', images=np.array([small], object))\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "try:\n"
        "    session.run('serving_default', images=np.array([small, huge], object)); code, message = 0, ''\n"
        "except capi.TFError as error:\n"
        "    code, message = error.code, error.message\n"
        "after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "print(json.dumps({'code': code, 'message': message, 'growth_mb': (after - before) / 1024}))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=ENV)
    assert result.returncode == 0, result.stderr[-2000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["code"] == 3 and "declares" in out["message"] and "144000000" in out["message"]
    assert out["growth_mb"] < 50, out


def test_a_headless_model_exports_features_only(tmp_path):
    headless = keras_vit.ViT(patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1, image_size=16,
                             include_top=False, pooling="avg")
    randomize_weights(headless, scale=0.3)
    path = saved_model.export_saved_model(headless, tmp_path, name="features")
    session = capi.SavedModelSession(path)
    try:
        assert sorted(n for n in session.signatures if not n.startswith("__")) == ["features"]
        out = session.run("features", images=strings(encoded_images()[1]))
    finally:
        session.close()
    assert list(out) == ["features"]
    expected = np.asarray(headless(tf.stack([model_inputs(decoded(encoded_images())[1])])))
    np.testing.assert_allclose(out["features"], expected, atol=1e-5)
    with pytest.raises(ValueError, match="no classification head.*labels"):
        saved_model.export_saved_model(headless, tmp_path, name="features", labels=LABELS)


@pytest.mark.parametrize("kwargs, message", [
    (dict(labels=["a", "b"]), "The model has 3 classes; received 2 labels"),
    # Written one per line, a line break would shift every later label.
    (dict(labels=["cat\ndog", "bird", "fish"]), r"label 0 holds a line break: 'cat\\ndog'"),
    (dict(top_k=0), r"top_k must be an integer from 1 to the 3 classes; received 0"),
    (dict(top_k=4), r"top_k must be an integer from 1 to the 3 classes; received 4"),
    (dict(crop_fraction=0.0), r"crop_fraction must be in \(0, 1\]; received 0.0"),
    (dict(max_image_pixels=0), r"max_image_pixels must be an integer >= 1; received 0"),
    (dict(version=-1), r"version must be an integer >= 0 .*; received -1"),
    (dict(version=True), r"version must be an integer >= 0 .*; received True"),
    (dict(metadata={"source": "x", "classes": 10}),
     r"must not set the keys the export writes; received keys \['classes'\]"),
])
def test_what_cannot_be_served_is_refused_before_anything_is_written(model, tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        saved_model.export_saved_model(model, tmp_path / "base", **kwargs)
    assert not (tmp_path / "base").exists()


def test_version_0_is_a_version_as_tf_serving_reads_it(tmp_path):
    assert saved_model._check_output(tmp_path / "base", 0, overwrite=False) == tmp_path / "base" / "0"
    assert saved_model.next_version(tmp_path / "base") == 1


def test_a_head_neither_softmax_nor_logits_is_refused_before_anything_is_written(tmp_path):
    # A sigmoid's outputs, softmaxed as if they were logits, would be served as wrong probabilities.
    sigmoid = keras_vit.ViT(patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2, image_size=16,
                            classes=3, classifier_activation="sigmoid")
    with pytest.raises(ValueError, match="softmax or return logits.*received the activation 'sigmoid' of layer 'head'"):
        saved_model.export_saved_model(sigmoid, tmp_path / "base")
    assert not (tmp_path / "base").exists()


def test_an_unwritable_output_is_refused(model, tmp_path):
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(ValueError, match="Cannot create the export directory"):
        saved_model.export_saved_model(model, tmp_path / "file" / "base")


def test_an_export_the_cpp_loader_cannot_serve_is_never_published(model, tmp_path, monkeypatch):
    """The exporter's own check catches the bug of saving the Keras model itself (two handles per weight)."""
    def save_the_keras_model(model, path, preprocessing, labels, top_k, jit_compile, check_input_range):
        functions = saved_model.ServingFunctions(model, preprocessing, None, top_k)
        root = tf.Module()
        root.model = model
        tf.saved_model.save(root, str(path), signatures={n: f.get_concrete_function()
                                                         for n, f in functions.functions.items()})
        return functions

    monkeypatch.setattr(saved_model, "_save", save_the_keras_model)
    with pytest.raises(RuntimeError, match=r"C API.*could not serve(.|\n)*Could not find variable"):
        saved_model.export_saved_model(model, tmp_path, name="vit")
    assert list(tmp_path.iterdir()) == []


def test_a_failed_export_leaves_no_version_nor_the_folders_made_for_it(model, tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(saved_model, "write_warmup", broken)
    with pytest.raises(OSError, match="disk full"):
        saved_model.export_saved_model(model, tmp_path / "serving" / "models", name="vit")
    assert list(tmp_path.iterdir()) == []
    # A model folder that was there keeps what it held.
    (tmp_path / "vit" / "1").mkdir(parents=True)
    with pytest.raises(OSError, match="disk full"):
        saved_model.export_saved_model(model, tmp_path, name="vit")
    assert [path.name for path in (tmp_path / "vit").iterdir()] == ["1"]


def test_warmup_records_cover_every_signature_and_read_as_tensorflow_reads_them(exported):
    from tensorflow_serving.apis import prediction_log_pb2

    path = exported / "assets.extra" / saved_model.WARMUP
    requests = serving_check.read_warmup(path)  # without TensorFlow's runtime: checked against it here
    assert [signature for signature, _ in requests] == [
        "serving_default", "predict_pixels", "predict_float", "embeddings"]
    assert tf.io.is_jpeg(requests[0][1]["images"][0])
    records = [record.numpy() for record in tf.data.TFRecordDataset(str(path))]
    assert len(records) == len(requests)
    for record, (signature, inputs) in zip(records, requests, strict=True):
        request = prediction_log_pb2.PredictionLog.FromString(record).predict_log.request
        assert request.model_spec.signature_name == signature and set(request.inputs) == set(inputs)
        for key, proto in request.inputs.items():
            expected = tf.make_ndarray(proto)
            assert inputs[key].dtype == (object if expected.dtype == object else expected.dtype)
            np.testing.assert_array_equal(inputs[key], expected)


def test_metadata_and_inspect(exported):
    meta = json.loads((exported / "assets.extra" / saved_model.METADATA).read_text())
    assert tuple(meta) == saved_model.METADATA_KEYS  # what `metadata` may not replace
    assert meta["preprocessing"]["image_size"] == [16, 16] and meta["preprocessing"]["input_range"] == [-1.0, 1.0]
    text = saved_model.inspect(exported)
    assert "signature serving_default: inputs {'images': 'string(any shape)'}" in text and '"classes": 3' in text


def test_command_line_export_inspect_and_refusals(model, tmp_path):
    model.save(tmp_path / "m.keras")
    (tmp_path / "labels.txt").write_text("\n".join(LABELS) + "\n")
    base = [sys.executable, "-m", "export", f"--model={tmp_path / 'm.keras'}", f"--output={tmp_path / 'serving'}"]
    result = subprocess.run([*base, f"--labels={tmp_path / 'labels.txt'}"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300, env=ENV)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "signature serving_default" in result.stdout and (tmp_path / "serving" / "vit" / "1").is_dir()
    # The exporter's refusals reach the command line as usage errors (each is tested in-process above).
    top_k, tflite, size = run_together([[*base, "--top_k=7"], [*base, "--format=tflite", "--images=*.png",
                                                                "--jit_compile"], [*base, "--image_size=0"]],
                                       timeout=300, cwd=ROOT, env=ENV)
    assert size.returncode != 0 and "--image_size must be a positive integer" in size.stderr  # was ignored
    assert top_k.returncode != 0, top_k.stderr[-1000:]
    assert "top_k must be an integer from 1 to the 3 classes; received 7" in top_k.stderr
    assert tflite.returncode != 0 and "--jit_compile apply to --format=saved_model only" in tflite.stderr
    assert sorted(p.name for p in (tmp_path / "serving" / "vit").iterdir()) == ["1"]


def test_image_files_are_read_as_requests_and_a_refused_one_is_named(model, tmp_path):
    """What a TFLite export verifies and calibrates on (`--images`): each file named if it cannot be read."""
    files = [tmp_path / "photo.png", tmp_path / "notes.png"]
    files[0].write_bytes(encode(photo(30, 40), "PNG"))
    files[1].write_text("not an image")
    bounded = prep.Preprocessing.for_model(model, max_image_pixels=1000)
    with pytest.raises(ValueError, match=r"image file .*photo.png cannot be read.*declares.*1200.*pixels"):
        prep.read_images(files[:1], bounded)
    unbounded = prep.Preprocessing.for_model(model, max_image_pixels=2**31 - 1)  # the command line's, for its files
    inputs = prep.read_images(files[:1] * 2, unbounded)
    np.testing.assert_allclose(inputs[0], model_inputs(decoded([files[0].read_bytes()])[0]), atol=1e-6)
    assert inputs.shape == (2, 16, 16, 3)
    with pytest.raises(ValueError, match=r"image file .*notes.png cannot be read.*not a JPEG, PNG"):
        prep.read_images(files, unbounded)


def test_saved_model_cli_runs_the_export(exported, tmp_path):
    """The TF1 session loader behind `saved_model_cli run` serves it too."""
    np.save(tmp_path / "x.npy", np.zeros((1, 16, 16, 3), np.float32))
    cli = pathlib.Path(sys.executable).parent / "saved_model_cli"
    result = subprocess.run([str(cli), "run", "--dir", str(exported), "--tag_set", "serve", "--signature_def",
                             "predict_float", "--inputs", f"inputs={tmp_path / 'x.npy'}"],
                            capture_output=True, text=True, timeout=300, env=ENV)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Result for output key probabilities" in result.stdout


CHECK_AS_TF_SERVING_DEFAULTS = """
import sys
from export import serving_check
try:
    serving_check.replay(sys.argv[1], sys.argv[2])  # XLA off: tensorflow_model_server's default
    print("served")
except SystemExit as refusal:
    print("refused:", refusal)
import tensorflow
print("TensorFlow's Python ran:", hasattr(tensorflow, "constant"))
"""


def test_a_jit_compile_export_runs_under_xla_where_tf_serving_enables_it(model, exported, served, tmp_path):
    xla = saved_model.export_saved_model(model, tmp_path, name="vit", labels=LABELS, top_k=2, jit_compile=True)
    assert json.loads((xla / "assets.extra" / saved_model.METADATA).read_text())["jit_compile"] is True
    # XLA compiles once per batch size: the warm-up covers every signature at batch 2 and at batch 1.
    warmup = serving_check.read_warmup(xla / "assets.extra" / saved_model.WARMUP)
    assert [(signature, len(next(iter(inputs.values())))) for signature, inputs in warmup][::4] == [
        ("serving_default", 2), ("serving_default", 1)]
    session = capi.SavedModelSession(xla)
    images = strings(*encoded_images())
    for name, inputs in (("serving_default", {"images": images}),
                         ("predict_float", {"inputs": np.random.default_rng(3).uniform(-1, 1, (3, 16, 16, 3))
                                            .astype(np.float32)})):
        got, want = session.run(name, **inputs), served.run(name, **inputs)
        np.testing.assert_allclose(got["probabilities"], want["probabilities"], atol=1e-5)
        assert got["top_k_labels"].tolist() == want["top_k_labels"].tolist()
    session.close()
    # TF Serving's default disables XLA: there the check refuses the jit export, and serves the plain one,
    # in a process where no TensorFlow Python code runs (as in the C++ server).
    off, plain = run_together([[sys.executable, "-c", CHECK_AS_TF_SERVING_DEFAULTS, str(path), str(tmp_path / name)]
                               for path, name in ((xla, "off.npz"), (exported, "plain.npz"))],
                              timeout=300, cwd=ROOT, env=ENV)
    assert off.returncode == 0 and plain.returncode == 0, off.stderr[-2000:] + plain.stderr[-2000:]
    assert "refused: warm-up request 0 (signature 'serving_default') failed: INTERNAL: XLA compilation disabled" \
        in off.stdout
    assert plain.stdout.splitlines() == ["served", "TensorFlow's Python ran: False"]
    assert off.stdout.splitlines()[-1] == "TensorFlow's Python ran: False"


@pytest.mark.parametrize("channels, mean, std", [
    (3, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)), (3, (0.5,), (0.5,)), (1, (0.5,), (0.25,))])
def test_request_pixels_are_scaled_by_the_models_mean_and_std(channels, mean, std):
    from export import preprocessing

    setting = preprocessing.Preprocessing((4, 5), channels, mean=mean, std=std)
    pixels = np.random.default_rng(0).integers(0, 256, (4, 5, channels)).astype(np.float32)
    scaled = preprocessing._scale(tf.constant(pixels), setting).numpy()
    np.testing.assert_allclose(scaled, (pixels / 255.0 - np.asarray(mean)) / np.asarray(std), rtol=1e-6, atol=1e-6)
