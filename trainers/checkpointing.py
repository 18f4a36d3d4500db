"""A run's checkpoints: its variables by position, the last few kept in a directory (`checkpoints/`, `best/`).

On Keras' TensorFlow backend they are `tf.train.Checkpoint`s (`ckpt-N.index` and its data), as every earlier run
wrote them, so those runs resume. On JAX the variables are not TensorFlow's: each checkpoint is one
`ckpt-N.npz` of their values, written under a temporary name and renamed, its number recorded in the
directory's `checkpoint` file only after. `open_checkpoints` gives the one the backend needs; both offer
`directory`, `latest`, `save(number)` and `restore_latest()`.
"""

import pathlib
import re
import zipfile

import keras
import numpy as np

from keras_vit.atomic_files import atomic_file, write_text_atomically


def open_checkpoints(model_variables, optimizer_variables, directory, max_to_keep):
    """The checkpoints of the variables (lists, their order the checkpoint's) kept in `directory`, the last
    `max_to_keep` of them."""
    if keras.backend.backend() == "tensorflow":
        return TensorFlowCheckpoints(model_variables, optimizer_variables, directory, max_to_keep)
    return ArrayCheckpoints([*model_variables, *optimizer_variables], directory, max_to_keep)


class TensorFlowCheckpoints:
    """`tf.train.CheckpointManager` over `tf.train.Checkpoint(model=..., optimizer=...)`."""

    def __init__(self, model_variables, optimizer_variables, directory, max_to_keep):
        import tensorflow as tf

        self.checkpoint = tf.train.Checkpoint(model=list(model_variables), optimizer=list(optimizer_variables))
        self.manager = tf.train.CheckpointManager(self.checkpoint, str(directory), max_to_keep=max_to_keep)
        self.directory = pathlib.Path(directory)

    @property
    def latest(self):
        """The last checkpoint's path without its suffixes (`.../ckpt-40`), or None."""
        return self.manager.latest_checkpoint

    def save(self, number):
        self.manager.save(checkpoint_number=number)

    def restore_latest(self):
        """Restores the last checkpoint; ValueError when it does not fit the variables."""
        import tensorflow as tf

        try:
            self.checkpoint.restore(self.latest).assert_consumed()
        except (AssertionError, ValueError, tf.errors.OpError) as error:
            raise ValueError(str(error)) from error


class ArrayCheckpoints:
    """`ckpt-N.npz` files of the variables' values; the directory's `checkpoint` file names the last."""

    def __init__(self, variables, directory, max_to_keep):
        self.variables = list(variables)
        self.directory = pathlib.Path(directory)
        self.max_to_keep = max_to_keep

    def _numbers(self):
        """The numbers the `checkpoint` file lists, oldest first."""
        record = self.directory / "checkpoint"
        return [int(n) for n in re.findall(r"ckpt-(\d+)", record.read_text())] if record.is_file() else []

    @property
    def latest(self):
        numbers = self._numbers()
        return str(self.directory / f"ckpt-{numbers[-1]}") if numbers else None

    def save(self, number):
        values = [keras.ops.convert_to_numpy(variable.value) for variable in self.variables]
        self.directory.mkdir(parents=True, exist_ok=True)
        with atomic_file(self.directory / f"ckpt-{number}.npz") as f:
            np.savez(f, *values)
        numbers = [n for n in self._numbers() if n != number] + [number]
        kept = numbers[-self.max_to_keep:]
        write_text_atomically(self.directory / "checkpoint", "".join(f"ckpt-{n}\n" for n in kept))
        for old in numbers[:-self.max_to_keep]:
            (self.directory / f"ckpt-{old}.npz").unlink(missing_ok=True)

    def restore_latest(self):
        """Restores the last checkpoint; ValueError naming the file and the first variable that does not fit."""
        path = f"{self.latest}.npz"
        try:
            with np.load(path) as arrays:
                values = [arrays[f"arr_{i}"] for i in range(len(arrays.files))]
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as error:  # missing, cut or not ours
            raise ValueError(f"{path} cannot be read ({type(error).__name__}: {error})") from error
        if len(values) != len(self.variables):
            raise ValueError(f"{path} holds {len(values)} variables; this run has {len(self.variables)}")
        for variable, value in zip(self.variables, values, strict=True):
            if tuple(value.shape) != tuple(variable.shape):
                raise ValueError(f"{path}: variable {variable.path} has shape {tuple(variable.shape)}; the file's "
                                 f"has {tuple(value.shape)}")
        for variable, value in zip(self.variables, values, strict=True):
            variable.assign(value)

