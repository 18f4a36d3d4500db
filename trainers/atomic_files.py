"""Files written whole or not at all: a temporary name, then an atomic rename."""

import os
import tempfile


def write_text_atomically(path, text):
    """Writes `text` to `path` (a pathlib.Path) so that a reader never sees half of it.

    The temporary file has a name of its own (workers and threads share
    model_dir) and goes if the write fails, so nothing is left beside `path`.
    """
    handle, tmp = tempfile.mkstemp(prefix=f"{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(handle, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide metrics and records from other users
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
