"""The whole-run progress line and the loop's stops for checkpoints and evaluations."""

import io

import keras
import numpy as np
import pytest

from trainers import recipes
from trainers.evaluation import next_stop
from trainers.progress import RunProgress, format_line


def test_the_line_shows_step_total_rate_eta_loss_and_learning_rate():
    line = format_line(300, 4000, 1234.4, 83.4, 1.23456, 1.9e-3)
    assert line.startswith("step 300/4000 [=>") and "   7.5%  1234 img/s  ETA 0:01:23  loss 1.2346  lr 1.90e-03" in line
    assert format_line(4000, 4000, 10, 0, 0.5, 0.0).startswith("step 4000/4000 [" + "=" * 24 + "] 100.0%")
    assert "  ? img/s  ETA ?  " in format_line(1, 10, None, None, 1.0, 1.0)


def test_stops_fall_on_checkpoints_evaluations_and_the_end():
    recipe = recipes.RECIPES["digits"].replace(train_steps=100, checkpoint_every=40)
    stops, step = [], 0
    while step < 100:
        step = next_stop(step, recipe, 30)
        stops.append(step)
    assert stops == [30, 40, 60, 80, 90, 100]
    assert next_stop(35, recipe, 0) == 40  # a resumed run meets the same stops


def test_one_bar_over_several_fits_counts_the_global_step():
    """Two fit calls (two chunks) make one bar to the run's total, a line per 5% in a log."""
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    out = io.StringIO()
    progress = RunProgress(total_steps=40, batch_size=4, stream=out)
    x, y = np.ones((80, 2), "float32"), np.ones((80, 1), "float32")
    for _ in range(2):
        model.fit(x, y, batch_size=4, epochs=1, steps_per_epoch=20, verbose=0, shuffle=False, callbacks=[progress])
    lines = out.getvalue().splitlines()
    # The first step (it shows the run has started), then every 2 steps (5% of 40).
    assert [line.split()[1] for line in lines] == [f"{step}/40" for step in [1, *range(2, 41, 2)]]
    assert "Epoch" not in out.getvalue() and "lr 1.00e-02" in lines[-1]


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_on_a_terminal_the_line_is_redrawn_in_place():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    out = _Terminal()
    x, y = np.ones((40, 2), "float32"), np.ones((40, 1), "float32")
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, shuffle=False, callbacks=[RunProgress(10, 4, stream=out)])
    text = out.getvalue()
    assert text.count("\r") == 10 and text.count("\n") == 1  # one line, redrawn per step, ended once
    last = text.split("\r")[-1]
    assert last.startswith("step 10/10 [" + "=" * 24 + "] 100.0%") and last.endswith("\n")


@pytest.mark.parametrize("kind, suffix", [("tensorflow", ".index"), ("arrays", ".npz")])
def test_best_json_names_a_checkpoint_that_exists_when_a_run_stops_between_them(tmp_path, monkeypatch, kind,
                                                                                suffix):
    import keras

    from trainers import checkpointing, evaluation

    variables = [keras.Variable(1.0, name="weight")]

    def opened():
        if kind == "tensorflow":
            return checkpointing.TensorFlowCheckpoints(variables, [], tmp_path / "best", max_to_keep=2)
        return checkpointing.ArrayCheckpoints(variables, tmp_path / "best", max_to_keep=2)

    best = evaluation.BestCheckpoint(opened(), tmp_path, True)
    best.consider(1, {"top1": 0.5, "top5": 0.9, "loss": 1.0})

    def killed(*args):
        raise KeyboardInterrupt  # after the checkpoint's save, before best.json names it

    monkeypatch.setattr(evaluation, "write_text_atomically", killed)
    try:
        best.consider(2, {"top1": 0.7, "top5": 0.9, "loss": 0.8})
    except KeyboardInterrupt:
        pass
    monkeypatch.undo()
    resumed = evaluation.BestCheckpoint(opened(), tmp_path, True)
    assert resumed.record["step"] == 1
    assert (tmp_path / "best" / f"{resumed.record['checkpoint']}{suffix}").exists()
