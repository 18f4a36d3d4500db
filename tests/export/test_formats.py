"""The export package's recipe holds for every registered format; what no format can export is refused by name."""

import importlib
import json
import os
import pathlib
import re
import shutil
import sys

import numpy as np
import pytest

import keras_vit
from export import choices, common
from tests.layer_checks import randomize_weights
from tests.processes import run_together

ROOT = pathlib.Path(__file__).parents[2]
HF_CLASSIFIER = ROOT / "tests" / "fixtures" / "hf" / "vit_classifier"  # five classes, id2label cat ... frog
TINY = dict(patch_size=4, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2, image_size=16, classes=3)


def test_every_registered_format_is_one_module_its_extra_brings():
    extra = re.search(r'"export": \[(.*?)\]', (ROOT / "setup.py").read_text(), re.S).group(1)
    cli = (ROOT / "export" / "__main__.py").read_text()
    for name, fmt in choices.FORMATS.items():
        module = importlib.import_module(f"export.{name}")
        assert callable(module.from_command_line) and callable(getattr(module, f"export_{name}")), name
        for _, distribution in fmt.needs:
            assert f'"{distribution}' in extra, f"setup.py's export extra lacks {distribution} ({name})"
        assert all(f'("{flag}"' in cli for flag in fmt.flags), (name, fmt.flags)  # defined by the CLI
        assert choices.missing_message(name) is None  # this machine has the extra


def test_a_non_finite_weight_is_named_by_its_path():
    model = keras_vit.ViT(patch_size=4, hidden_size=16, mlp_dim=32, num_heads=2, num_layers=2, image_size=8,
                          classes=3)
    kernel = next(w for w in model.get_layer("encoder_block_1").weights if len(w.shape) == 2)
    values = kernel.numpy()
    values[0, 0] = np.nan
    kernel.assign(values)
    error = None
    try:
        common.check_finite_weights(model)
    except common.ModelError as raised:
        error = str(raised)
    assert error and repr(kernel.path) in error and "1 non-finite value(s)" in error, error


def test_labels_that_do_not_fit_the_head_and_a_nan_weight_are_one_line_naming_their_source(tmp_path):
    gap, short = tmp_path / "gap", tmp_path / "short"
    config = json.loads((HF_CLASSIFIER / "config.json").read_text())
    for folder, id2label in ((gap, {"0": "cat", "1": "dog", "3": "fish", "4": "frog"}),
                             (short, {"0": "cat", "1": "dog", "2": "bird", "3": "fish"})):
        shutil.copytree(HF_CLASSIFIER, folder)
        (folder / "config.json").write_text(json.dumps({**config, "id2label": id2label}))
    nan = keras_vit.ViT(patch_size=4, hidden_size=16, mlp_dim=32, num_heads=2, num_layers=2, image_size=8, classes=3)
    values = nan.get_layer("head").kernel.numpy()
    values[1, 2] = np.inf
    nan.get_layer("head").kernel.assign(values)
    nan.save(tmp_path / "nan.keras")
    (tmp_path / "four.txt").write_text("a\nb\nc\nd\n")
    cases = {  # --model, other flags: the one line expected
        gap: ([], rf"{re.escape(str(gap / 'config.json'))}: id2label must name every class from 0 to 4; it "
                  r"skips \[2\]: correct it, or pass --labels=FILE with one class name per line"),
        short: ([], rf"{re.escape(str(short / 'config.json'))}'s id2label names 4 classes; the model's head has "
                    r"5: correct it, or pass --labels=FILE"),
        HF_CLASSIFIER: ([f"--labels={tmp_path / 'four.txt'}"], rf"--labels='{re.escape(str(tmp_path))}/four.txt' "
                                                               r"\(one class name per line\) names 4 classes; the "
                                                               r"model's head has 5$"),
        tmp_path / "nan.keras": ([], r"The model's weight 'head/kernel' holds 1 non-finite value\(s\) \(NaN "
                                     r"or infinity\) of its 48: it gives no scores to export"),
    }
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    results = run_together([[sys.executable, "-m", "export", f"--model={model}", *more,
                             f"--output={tmp_path / 'out' / str(i)}"] for i, (model, (more, _)) in
                            enumerate(cases.items())], cwd=ROOT, env=env, timeout=300)
    for result, (model, (_, expected)) in zip(results, cases.items(), strict=True):
        assert result.returncode == 1 and "Traceback" not in result.stderr, (model, result.stderr[-2000:])
        assert re.search(expected, result.stderr.strip().splitlines()[0]), (model, result.stderr)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name, runtime", [("onnx", "ONNX Runtime"), ("openvino", "OpenVINO")])
def test_a_file_that_misses_its_tolerance_or_cannot_run_is_not_written(name, runtime, tmp_path, monkeypatch):
    module = importlib.import_module(f"export.{name}")
    export = getattr(module, f"export_{name}")
    model = keras_vit.ViT(**TINY, classifier_activation=None)
    randomize_weights(model, scale=0.3)  # a head that decides something, so reversed scores miss
    images = np.random.default_rng(0).uniform(-1, 1, (4, 16, 16, 3)).astype("float32")
    client_scores = common.client_scores
    monkeypatch.setattr(common, "client_scores", lambda *args: client_scores(*args)[:, ::-1])
    with pytest.raises(common.ToleranceError, match="is not within .* Nothing was written"):
        export(model, tmp_path / "out", images)
    monkeypatch.setattr(common, "client_scores", client_scores)
    monkeypatch.setattr(module, "CLIENT", module.CLIENT.replace('["scores"]', '["no_such_output"]'))
    with pytest.raises(RuntimeError, match=f"{runtime} could not run the exported model: .*no_such_output"):
        export(model, tmp_path / "out", images)
    assert os.listdir(tmp_path) == []  # no directory, no staging left
