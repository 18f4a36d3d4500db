"""Which Keras backend runs what.

The library (layers, builders, `ViTConfig`, checkpoints, preprocessing and
resizing, analysis, `python -m keras_vit.explain`) runs on Keras' TensorFlow,
JAX and PyTorch backends and needs TensorFlow only for `gs://`-style paths
(tests/backends/). Off TensorFlow, `keras.ops` resizes (bicubic as
TensorFlow's kernel, to a level of its pixels) and Pillow decodes `explain`'s
image; with TensorFlow there, its decoders, and on its backend its resize,
as the trainer and the exported model use. The trainer (`tf.data`,
`tf.distribute`) and the exporter (SavedModel, TFLite) are TensorFlow
programs: they call `tensorflow_backend_problem` before their work starts.
"""

import os

# What each application needs TensorFlow for, for its refusal.
TENSORFLOW_PROGRAMS = {
    "trainers.train": "tf.data input pipelines and tf.distribute strategies",
    "export": "SavedModel and TFLite export",
}


def tensorflow_backend_problem(program):
    """None when Keras runs on TensorFlow here; else one line saying why `program` cannot, and what to set.

    Imports Keras, and so its backend: call it once the command's flags have
    passed, where TensorFlow would be imported next.
    """
    if program not in TENSORFLOW_PROGRAMS:
        raise ValueError(f"`program` must be one of {sorted(TENSORFLOW_PROGRAMS)}; received program={program!r}")
    needs = f"python -m {program} runs on Keras' TensorFlow backend ({TENSORFLOW_PROGRAMS[program]})"
    try:
        import keras
    except ImportError as error:  # the configured backend's framework is not installed
        return (f"{needs}, and Keras could not start its backend ({error}): install TensorFlow "
                f"(pip install -e '.[train]' or '.[export]') and set KERAS_BACKEND=tensorflow")
    backend = keras.backend.backend()
    if backend == "tensorflow":
        return None
    source = (f"KERAS_BACKEND={os.environ['KERAS_BACKEND']}" if os.environ.get("KERAS_BACKEND")
              else "the backend in ~/.keras/keras.json")
    return (f"{needs}; Keras runs on {backend} here ({source}): set KERAS_BACKEND=tensorflow "
            "(keras_vit's models, checkpoints and analysis run on every backend)")
