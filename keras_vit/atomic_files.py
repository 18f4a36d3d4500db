"""Files written whole or not at all: a temporary name of their own, then an atomic rename."""

import contextlib
import os
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
