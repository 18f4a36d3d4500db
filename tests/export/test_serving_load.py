"""One export under 8 concurrent clients through TF Serving's loader: the short form of benchmarks.serving_load."""

import numpy as np
import pytest

import keras_vit
from benchmarks import serving_load
from export import capi, saved_model
from export import preprocessing as prep


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """An export loaded by TF Serving's loader; written without the exporter's proof (other tests run it)."""
    model = keras_vit.ViT(patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2, image_size=16,
                          classes=3)
    path = tmp_path_factory.mktemp("export") / "1"
    path.mkdir()
    preprocessing = prep.Preprocessing.for_model(model, 1.0, serving_load.MAX_IMAGE_PIXELS)
    saved_model._save(model, path, preprocessing, None, 3, False)
    session = capi.SavedModelSession(path)
    yield session
    session.close()


def test_eight_clients_get_the_serial_answers_and_refusals(session):
    report = serving_load.run(session, threads=8, seconds=3.0, warmup_seconds=1.0, image_size=(16, 16))
    assert serving_load.problems(report) == []
    assert report["hung_clients"] == 0 and report["mismatches"] == 0
    assert set(report["kinds"]) == set(report["sent"])  # every kind of request ran under load
    assert report["resident_mib_after_run"] - report["resident_mib_after_warmup"] <= serving_load.MEMORY_BOUND_MIB
    bad = [kind for kind, entry in report["kinds"].items() if not entry["good"]]
    assert {"cut jpeg", "oversized", "raw pixels as float", "not an image"} <= set(bad)


def test_the_serial_answers_refuse_each_bad_request_with_invalid_argument(session):
    requests = serving_load.make_requests((16, 16))
    answers = serving_load.serial_answers(session, requests)
    for kind, (_, _, good) in requests.items():
        assert isinstance(answers[kind], capi.TFError) is not good, kind
        if not good:
            assert answers[kind].code == serving_load.INVALID_ARGUMENT, (kind, answers[kind])
    assert answers["empty batch"]["probabilities"].shape == (0, 3)
    # A mismatch is found: an answer that differs in one bit is not the serial answer.
    changed = {**answers["jpeg"], "probabilities": np.nextafter(answers["jpeg"]["probabilities"], 2)}
    assert not serving_load.same(changed, answers["jpeg"]) and serving_load.same(answers["jpeg"], answers["jpeg"])
