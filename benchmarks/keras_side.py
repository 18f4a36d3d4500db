"""keras_vit's side of the side-by-side benchmark, run by `benchmarks.worker`.

The functions mirror `benchmarks.timm_side`: each builds one workload and
returns a callable that runs it once and waits for the result.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_vit  # noqa: E402


def versions():
    return {"tensorflow": tf.__version__, "keras": keras.__version__, "keras_vit": keras_vit.__version__}


def set_threads(threads):
    tf.config.threading.set_intra_op_parallelism_threads(threads)


def matmul(m, k, n, dtype="float32"):
    a = tf.random.normal((m, k), dtype=dtype)
    b = tf.random.normal((k, n), dtype=dtype)
    # Waits for the product by fetching one element: fetching it all would time a device-to-host copy.
    return lambda: tf.linalg.matmul(a, b)[0, 0].numpy()


def _model(variant, image_size, precision, num_layers, scan_layers):
    fields = keras_vit.decode_variant(variant)
    if num_layers:
        fields["num_layers"] = num_layers
    keras.mixed_precision.set_global_policy(precision)
    try:
        return keras_vit.ViT(**fields, image_size=image_size, classifier_activation=None, scan_layers=scan_layers)
    finally:
        keras.mixed_precision.set_global_policy("float32")


def inference(variant, batch, image_size, compiled=True, precision="float32", num_layers=None, scan_layers=False):
    """`compiled` asks for XLA (`jit_compile=True`); off runs the TF graph."""
    model = tf.function(_model(variant, image_size, precision, num_layers, scan_layers), jit_compile=compiled)
    images = tf.random.uniform((batch, image_size, image_size, 3), -1, 1)
    return lambda: model(images).numpy()


def training(variant, batch, image_size, compiled=True, precision="float32", num_layers=None, scan_layers=False):
    model = _model(variant, image_size, precision, num_layers, scan_layers)
    model.compile(optimizer=keras.optimizers.AdamW(1e-4), jit_compile=compiled,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    images = tf.random.uniform((batch, image_size, image_size, 3), -1, 1)
    labels = tf.range(batch) % 1000
    return lambda: model.train_on_batch(images, labels)
