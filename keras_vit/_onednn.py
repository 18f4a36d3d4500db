"""TensorFlow's oneDNN CPU kernels on every x86 CPU, not only on those TensorFlow picks.

TensorFlow turns them on by default only on x86 CPUs with AVX-512 VNNI, BF16 or AMX; an AVX2 CPU runs Eigen's
kernels, and a ViT's training step there takes 1.3-1.6x as long (docs/performance.md). TensorFlow reads
`TF_ENABLE_ONEDNN_OPTS` once, as it loads, so `import keras_vit` sets it to 1 when TensorFlow is not loaded yet
and the user has not chosen; a model's first training step on TensorFlow warns once where the kernels ended up
off without the user's choice (TensorFlow imported before keras_vit).
"""

import os
import platform
import sys
import warnings

VARIABLE = "TF_ENABLE_ONEDNN_OPTS"
_X86 = ("x86_64", "amd64", "i386", "i686")
# The variable as `import keras_vit` found it (None: nobody chose), and whether a training step has looked yet.
_state = {"chosen": None, "looked": False}


def prefer_onednn(environ=os.environ):
    """Sets `TF_ENABLE_ONEDNN_OPTS=1` on x86 unless it is set or TensorFlow already loaded; returns whether it did."""
    _state["chosen"] = environ.get(VARIABLE)
    if platform.machine().lower() not in _X86 or _state["chosen"] is not None or "tensorflow" in sys.modules:
        return False
    environ[VARIABLE] = "1"
    return True


def warn_if_off():
    """Warns where TensorFlow runs on x86 without its oneDNN kernels and nobody chose that; looks once per process
    (TensorFlow fixed the answer as it loaded), so later training steps pay nothing."""
    if _state["looked"]:
        return False
    _state["looked"] = True
    if _state["chosen"] is not None or platform.machine().lower() not in _X86:
        return False
    from keras_vit.layers.keras_internals import tensorflow_onednn_enabled

    if tensorflow_onednn_enabled() is not False:  # on, or TensorFlow no longer says
        return False
    warnings.warn(
        f"TensorFlow's oneDNN CPU kernels are off on this CPU (TensorFlow turns them on only for AVX-512 VNNI, BF16 "
        f"or AMX): a ViT trains 1.3-1.6x faster with them. Set {VARIABLE}=1 in the environment, or import "
        f"keras_vit before TensorFlow (and Keras) so that it sets it; set {VARIABLE}=0 to keep them off quietly.",
        UserWarning, stacklevel=3)
    return True
