"""Checkpoint bytes in and out: local files with Python's own I/O, other file systems through TensorFlow.

A path with a scheme (`gs://bucket/ViT-B_16.npz`) is opened with
`tf.io.gfile`, which knows those file systems; every other path is a local
file and needs no TensorFlow, so the checkpoint readers and writers run on
Keras' JAX and PyTorch backends without it installed.
"""

import os
import pathlib
import re

from keras_vit.atomic_files import atomic_file


def has_scheme(path):
    """Whether `path` names a file system by its scheme (`gs://...`) rather than a local file."""
    return re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", str(path)) is not None


def _gfile(path):
    """`tf.io.gfile`, imported only for a path with a scheme: a local file never needs TensorFlow."""
    try:
        import tensorflow as tf
    except ImportError as error:
        raise ImportError(f"{path} is not a local file: reading or writing it needs tf.io.gfile; install "
                          f"tensorflow, or copy the file to a local disk ({error})") from error
    return tf.io.gfile


def read_bytes(path):
    """The whole contents of `path` (a local file, or a `gs://`-style URL)."""
    path = str(path)
    if not has_scheme(path):
        with open(path, "rb") as f:
            return f.read()
    with _gfile(path).GFile(path, "rb") as f:
        return f.read()


def write_bytes(path, data):
    """Writes `data` to `path` whole or not at all: under a temporary name, renamed when complete.

    So a crash never leaves a half-written file under `path`, nor a temporary beside it.
    """
    path = str(path)
    if not has_scheme(path):
        with atomic_file(pathlib.Path(path)) as f:
            f.write(data)
        return path
    gfile = _gfile(path)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with gfile.GFile(tmp, "wb") as f:
            f.write(data)
        gfile.rename(tmp, path, overwrite=True)
    finally:
        if gfile.exists(tmp):
            gfile.remove(tmp)
    return path


def refuse_non_empty_directory(directory, what):
    """A model directory is written whole into an empty or new folder: writing over another model's files would
    mix the two (a config.json of one, shards of the other), so nothing is replaced."""
    directory = str(directory)
    if os.path.exists(directory) and (not os.path.isdir(directory) or os.listdir(directory)):
        found = sorted(os.listdir(directory))[:6] if os.path.isdir(directory) else "a file"
        raise ValueError(f"{what} is written into a new or empty directory; {directory} holds {found}. Nothing was "
                         "written: remove it or choose another directory")
