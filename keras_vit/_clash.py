"""Detects the abandoned PyPI package `keras-vit`, which also imports as `keras_vit`.

Both distributions install files under `keras_vit/`; pip does not notice, so
whichever was installed last overwrote the other's files, and uninstalling
either deletes files the other needs. See BUILD.md ("The import-name clash").
"""

import importlib.metadata
import warnings

OURS = "keras-vision-transformer"
CLASHING = "keras-vit"


def warn_if_shadowed():
    """Warns when the clashing distribution is installed beside ours."""
    try:
        importlib.metadata.distribution(CLASHING)
    except importlib.metadata.PackageNotFoundError:
        return False
    warnings.warn(
        f"The PyPI package '{CLASHING}' (an unrelated, abandoned project) is installed and "
        f"also imports as 'keras_vit'; its files and ours overwrite each other. Run "
        f"`pip uninstall -y {CLASHING} {OURS}` and then `pip install {OURS}`.",
        UserWarning,
        stacklevel=3,
    )
    return True
