"""Files written whole or not at all: a temporary name of their own, then an atomic rename."""

import contextlib
import os
import shutil
import tempfile


@contextlib.contextmanager
def atomic_file(path, mode="wb"):
    """Yields a file object whose contents appear at `path` (a pathlib.Path) only when the block completes.

    The temporary file beside `path` has a name of its own (threads, processes
    and hosts may write the same path at once) and goes if the block raises,
    so nothing half-written is left, nor taken for `path`.
    """
    handle, tmp = tempfile.mkstemp(prefix=f"{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(handle, mode) as f:
            yield f
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide the file from other users
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_text_atomically(path, text):
    """Writes `text` to `path` (a pathlib.Path) so that a reader never sees half of it."""
    with atomic_file(path, "w") as f:
        f.write(text)


@contextlib.contextmanager
def new_directory(path):
    """Yields a staging directory that appears at `path` (a new directory) only when the block completes.

    The staging directory sits beside `path` (one filesystem, so the rename is
    atomic) under a dot name, so a killed process's left-over never looks like
    an export; it goes if the block raises. The rename fails on a non-empty
    target: a directory finished meanwhile at `path` survives.
    """
    parent, name = os.path.split(os.path.abspath(os.fspath(path)))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=parent)
    try:
        yield staging
        os.rename(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
