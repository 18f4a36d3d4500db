"""Files written whole or not at all: a temporary name, then an atomic rename."""

import os


def write_text_atomically(path, text):
    """Writes `text` to `path` (a pathlib.Path) so that a reader never sees half of it."""
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")  # per process: workers share model_dir
    tmp.write_text(text)
    os.replace(tmp, path)
