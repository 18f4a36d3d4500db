import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from export import loading, saved_model
from tests.layer_checks import randomize_weights

ROOT = pathlib.Path(__file__).parents[2]
LABELS = ["cat", "dog", "bird"]


@pytest.fixture(scope="module")
def model():
    model = keras_vit.ViT(patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2, image_size=16,
                          classes=3, classifier_activation=None)
    randomize_weights(model, scale=0.3)
    return model


def encoded_images():
    """A JPEG and a PNG of other sizes than the model's."""
    rng = np.random.default_rng(0)
    photo = rng.integers(0, 256, (20, 28, 3), dtype=np.uint8)
    drawing = np.repeat(np.linspace(0, 255, 24, dtype=np.uint8)[None, :, None], 18, 0).repeat(3, 2)
    return [tf.io.encode_jpeg(photo).numpy(), tf.io.encode_png(drawing).numpy()]


def keras_probabilities(model, images):
    """What the export must compute: decode, resize to 16x16, scale to [-1, 1], softmax."""
    inputs = [tf.image.resize(tf.io.decode_image(b, channels=3), (16, 16)) / 127.5 - 1.0 for b in images]
    return tf.nn.softmax(model(tf.stack(inputs))).numpy()


@pytest.fixture(scope="module")
def exported(model, tmp_path_factory):
    base = tmp_path_factory.mktemp("serving")
    return saved_model.export_saved_model(model, base, name="vit", labels=LABELS, top_k=2)


def test_tf_serving_layout_and_versions(model, exported):
    assert exported.name == "1" and (exported / "saved_model.pb").exists() and (exported / "variables").is_dir()
    second = saved_model.export_saved_model(model, exported.parents[1], name="vit")
    assert second.name == "2"
    with pytest.raises(ValueError, match="Version 1 of 'vit' exists"):
        saved_model.export_saved_model(model, exported.parents[1], name="vit", version=1)


def test_signatures_names_and_dtypes(exported):
    signatures = tf.saved_model.load(str(exported)).signatures
    assert set(signatures) == {"serving_default", "predict_pixels", "predict_float", "embeddings"}
    default = signatures["serving_default"]
    assert default.structured_input_signature[1]["images"].dtype == tf.string
    outputs = default.structured_outputs
    assert {k: v.dtype for k, v in outputs.items()} == {
        "probabilities": tf.float32, "top_k_classes": tf.int32, "top_k_scores": tf.float32,
        "top_k_labels": tf.string}
    assert signatures["predict_pixels"].structured_input_signature[1]["pixels"].dtype == tf.uint8
    assert signatures["predict_float"].structured_input_signature[1]["inputs"].shape.as_list() == [None, 16, 16, 3]


def test_fresh_process_gives_the_keras_probabilities_and_labels(model, exported, tmp_path):
    images = encoded_images()
    np.save(tmp_path / "images.npy", np.array(images, dtype=object), allow_pickle=True)
    script = (
        "import numpy as np, tensorflow as tf, json, sys\n"
        f"images = list(np.load({str(tmp_path / 'images.npy')!r}, allow_pickle=True))\n"
        f"f = tf.saved_model.load({str(exported)!r}).signatures['serving_default']\n"
        "out = f(images=tf.constant(images))\n"
        "print(json.dumps({k: v.numpy().tolist() if v.dtype != tf.string else "
        "[[s.decode() for s in row] for row in v.numpy()] for k, v in out.items()}))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 0, result.stderr[-2000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    expected = keras_probabilities(model, images)
    np.testing.assert_allclose(out["probabilities"], expected, atol=1e-5)
    best = expected.argmax(1)
    assert [row[0] for row in out["top_k_classes"]] == best.tolist()
    assert [row[0] for row in out["top_k_labels"]] == [LABELS[i] for i in best]
    assert np.abs(expected - 1 / 3).max() > 0.05  # not a flat model


def test_pixels_embeddings_and_float_signatures_agree(model, exported):
    loaded = tf.saved_model.load(str(exported)).signatures
    png = encoded_images()[1]
    pixels = tf.io.decode_png(png)[None]
    by_pixels = loaded["predict_pixels"](pixels=pixels)["probabilities"].numpy()
    by_bytes = loaded["serving_default"](images=tf.constant([png]))["probabilities"].numpy()
    np.testing.assert_allclose(by_pixels, by_bytes, atol=1e-6)
    inputs = tf.image.resize(tf.cast(pixels, tf.float32), (16, 16)) / 127.5 - 1.0
    by_float = loaded["predict_float"](inputs=inputs)["probabilities"].numpy()
    np.testing.assert_allclose(by_float, by_bytes, atol=1e-6)
    embeddings = loaded["embeddings"](images=tf.constant([png, png]))["embeddings"]
    assert embeddings.shape == (2, 32)


def test_a_bad_element_is_named_and_the_server_goes_on(exported):
    serve = tf.saved_model.load(str(exported)).signatures["serving_default"]
    good = encoded_images()[0]
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"images element.*\b1\b.*is not a JPEG or PNG"):
        serve(images=tf.constant([good, b"not an image"]))
    assert serve(images=tf.constant([good]))["probabilities"].shape == (1, 3)


def test_warmup_records_are_prediction_logs(exported):
    from tensorflow_serving.apis import prediction_log_pb2

    path = exported / "assets.extra" / "tf_serving_warmup_requests"
    logs = [prediction_log_pb2.PredictionLog.FromString(r.numpy()) for r in tf.data.TFRecordDataset(str(path))]
    assert len(logs) == 2
    request = logs[0].predict_log.request
    assert request.model_spec.name == "vit" and request.model_spec.signature_name == "serving_default"
    assert tf.io.is_jpeg(tf.make_ndarray(request.inputs["images"])[0])


def test_metadata_and_inspect(exported):
    meta = json.loads((exported / "assets.extra" / saved_model.METADATA).read_text())
    assert meta["preprocessing"]["image_size"] == [16, 16] and meta["preprocessing"]["input_range"] == [-1.0, 1.0]
    text = saved_model.inspect(exported)
    assert "signature serving_default: inputs {'images': 'string(None,)'}" in text and '"classes": 3' in text


def test_a_failed_export_leaves_no_version(model, tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(saved_model, "write_warmup", broken)
    with pytest.raises(OSError, match="disk full"):
        saved_model.export_saved_model(model, tmp_path, name="vit")
    assert list((tmp_path / "vit").iterdir()) == []


def test_wrong_labels_count(model, tmp_path):
    with pytest.raises(ValueError, match="The model has 3 classes; received 2 labels"):
        saved_model.export_saved_model(model, tmp_path, labels=["a", "b"])


def test_loading_an_npz_with_its_variant(tmp_path):
    model = keras_vit.ViT_Ti16(image_size=32, classes=4, classifier_activation=None)
    randomize_weights(model, scale=0.05)
    keras_vit.save_npz(model, tmp_path / "ti.npz")
    loaded = loading.load_model(tmp_path / "ti.npz", variant="Ti/16")
    assert loaded.input_shape == (None, 32, 32, 3) and loaded.output_shape == (None, 4)
    x = np.random.default_rng(0).uniform(-1, 1, (1, 32, 32, 3)).astype("float32")
    np.testing.assert_allclose(np.asarray(loaded(x)), np.asarray(model(x)), atol=1e-5)
    with pytest.raises(ValueError, match="needs its variant"):
        loading.load_model(tmp_path / "ti.npz")


def test_command_line_export_and_inspect(model, tmp_path):
    model.save(tmp_path / "m.keras")
    (tmp_path / "labels.txt").write_text("\n".join(LABELS) + "\n")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run([sys.executable, "-m", "export", f"--model={tmp_path / 'm.keras'}",
                             f"--output={tmp_path / 'serving'}", "--name=vit", f"--labels={tmp_path / 'labels.txt'}"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "signature serving_default" in result.stdout and (tmp_path / "serving" / "vit" / "1").is_dir()
    inspect = subprocess.run([sys.executable, "-m", "export", f"--inspect={tmp_path / 'serving' / 'vit' / '1'}"],
                             cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert inspect.returncode == 0 and "top_k_labels" in inspect.stdout


def test_saved_model_cli_lists_the_signatures(exported):
    cli = pathlib.Path(sys.executable).parent / "saved_model_cli"
    result = subprocess.run([str(cli), "show", "--dir", str(exported), "--all"], capture_output=True, text=True,
                            timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 0, result.stderr[-2000:]
    for name in ("serving_default", "predict_pixels", "predict_float", "embeddings", "top_k_labels"):
        assert name in result.stdout


def test_a_scanned_model_serves_the_same_probabilities(model, tmp_path):
    scanned = keras_vit.ViT(patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2, image_size=16,
                            classes=3, classifier_activation=None, scan_layers=True)
    keras_vit.load_npz(scanned, keras_vit.save_npz(model, tmp_path / "m.npz"))
    path = saved_model.export_saved_model(scanned, tmp_path / "serving", name="vit", labels=LABELS)
    images = encoded_images()
    served = tf.saved_model.load(str(path)).signatures["serving_default"](images=tf.constant(images))
    np.testing.assert_allclose(served["probabilities"].numpy(), keras_probabilities(model, images), atol=1e-5)
