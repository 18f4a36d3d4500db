"""Which Keras backend runs what.

The library (layers, builders, `ViTConfig`, checkpoints, preprocessing and
resizing, analysis, `python -m keras_vit.explain`) runs on Keras' TensorFlow,
JAX and PyTorch backends and needs TensorFlow only for `gs://`-style paths
(tests/backends/). Off TensorFlow, `keras.ops` resizes (bicubic as
TensorFlow's kernel, to a level of its pixels) and Pillow decodes `explain`'s
image; with TensorFlow there, its decoders, and on its backend its resize,
as the trainer and the exported model use. The trainer reads its data with
`tf.data` and runs its step on TensorFlow (`tf.distribute`) or JAX
(`keras.distribution`); the exporter (SavedModel, TFLite) is a TensorFlow
program. Both call `backend_problem` before their work starts.
"""

import importlib.util
import os

# The backends each application runs on, and what it needs them (and TensorFlow) for, for its refusal.
PROGRAMS = {
    "trainers.train": (("tensorflow", "jax"), "tf.data input pipelines; its step under tf.distribute, or "
                                              "keras.distribution on JAX: Keras' PyTorch trainer has neither that "
                                              "nor steps_per_execution"),
    "export": (("tensorflow",), "SavedModel and TFLite export"),
}
_NAMES = {"tensorflow": "TensorFlow", "jax": "JAX"}


def backend_problem(program):
    """None when Keras runs `program`'s backend here; else one line saying why `program` cannot, and what to set.

    Imports Keras, and so its backend: call it once the command's flags have
    passed, where TensorFlow would be imported next.
    """
    if program not in PROGRAMS:
        raise ValueError(f"`program` must be one of {sorted(PROGRAMS)}; received program={program!r}")
    backends, reason = PROGRAMS[program]
    names = " or ".join(_NAMES[backend] for backend in backends)
    needs = f"python -m {program} runs on Keras' {names} backend ({reason})"
    settings = " or ".join(f"KERAS_BACKEND={backend}" for backend in backends)
    try:
        import keras
    except ImportError as error:  # the configured backend's framework is not installed
        return (f"{needs}, and Keras could not start its backend ({error}): install TensorFlow "
                f"(pip install -e '.[train]' or '.[export]') and set {settings}")
    backend = keras.backend.backend()
    if backend in backends:
        if backend != "tensorflow" and importlib.util.find_spec("tensorflow") is None:
            return f"{needs}; TensorFlow is not installed here: pip install -e '.[train]'"
        return None
    source = (f"KERAS_BACKEND={os.environ['KERAS_BACKEND']}" if os.environ.get("KERAS_BACKEND")
              else "the backend in ~/.keras/keras.json")
    return (f"{needs}; Keras runs on {backend} here ({source}): set {settings} "
            "(keras_vit's models, checkpoints and analysis run on every backend)")
