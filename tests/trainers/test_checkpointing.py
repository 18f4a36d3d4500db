"""`trainers.checkpointing.ArrayCheckpoints`, the JAX run's checkpoints, on Keras variables of this backend."""

import keras
import numpy as np
import pytest

from trainers.checkpointing import ArrayCheckpoints


def _variables(shapes):
    return [keras.Variable(np.full(shape, 0.0, "float32"), name=f"v{i}") for i, shape in enumerate(shapes)]


def test_the_last_two_are_kept_and_the_latest_restores(tmp_path):
    variables = _variables([(2, 3), ()])
    checkpoints = ArrayCheckpoints(variables, tmp_path / "checkpoints", max_to_keep=2)
    assert checkpoints.latest is None
    for step in (5, 10, 15):
        for variable in variables:
            variable.assign(np.full(variable.shape, float(step), "float32"))
        checkpoints.save(step)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["checkpoint", "ckpt-10.npz", "ckpt-15.npz"]
    assert checkpoints.latest == str(tmp_path / "checkpoints" / "ckpt-15")
    for variable in variables:
        variable.assign(np.zeros(variable.shape, "float32"))
    ArrayCheckpoints(variables, tmp_path / "checkpoints", max_to_keep=2).restore_latest()
    assert all((keras.ops.convert_to_numpy(v) == 15).all() for v in variables)


def test_a_checkpoint_of_another_model_or_a_cut_file_is_named(tmp_path):
    ArrayCheckpoints(_variables([(2, 3), (4,)]), tmp_path, 2).save(5)
    with pytest.raises(ValueError, match=r"ckpt-5.npz: variable v1 has shape \(5,\); the file's has \(4,\)"):
        ArrayCheckpoints(_variables([(2, 3), (5,)]), tmp_path, 2).restore_latest()
    with pytest.raises(ValueError, match=r"ckpt-5.npz holds 2 variables; this run has 1"):
        ArrayCheckpoints(_variables([(2, 3)]), tmp_path, 2).restore_latest()
    (tmp_path / "ckpt-5.npz").write_bytes((tmp_path / "ckpt-5.npz").read_bytes()[:100])
    with pytest.raises(ValueError, match=r"ckpt-5.npz cannot be read \(BadZipFile"):
        ArrayCheckpoints(_variables([(2, 3), (4,)]), tmp_path, 2).restore_latest()
