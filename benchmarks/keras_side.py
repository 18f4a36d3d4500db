"""keras_vit's side of the side-by-side benchmark, run by `benchmarks.worker`.

The functions mirror `benchmarks.timm_side`: each builds one workload and
returns a callable that runs it once and waits for the result. Keras runs on
the backend `KERAS_BACKEND` names: TensorFlow (the package's own), JAX where
TensorFlow cannot be installed (the lent GPU machines; BUILD.md), or PyTorch
(eager only: against timm eager, the same framework underneath).
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras import ops  # noqa: E402

import keras_vit  # noqa: E402

BACKEND = keras.backend.backend()


def versions():
    found = {"backend": BACKEND, "keras": keras.__version__, "keras_vit": keras_vit.__version__}
    framework = __import__(BACKEND)
    return {**found, BACKEND: framework.__version__, "device": _device()}


def _device():
    """What the model runs on: the first accelerator's name, or "cpu"."""
    if BACKEND == "jax":
        import jax

        device = jax.devices()[0]
        return "cpu" if device.platform == "cpu" else device.device_kind
    if BACKEND == "torch":
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    return tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU") if gpus else "cpu"


def set_threads(threads):
    if BACKEND == "tensorflow":
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(threads)
    elif BACKEND == "torch":
        import torch

        torch.set_num_threads(threads)
    elif threads < os.cpu_count():
        print(f"keras_side: {BACKEND} sizes its CPU thread pool itself; {threads} threads not enforced",
              file=sys.stderr)


def matmul(m, k, n, dtype="float32"):
    a = keras.random.normal((m, k), dtype=dtype)
    b = keras.random.normal((k, n), dtype=dtype)
    # Waits for the product by fetching one element (as float32: numpy has no bfloat16 of TensorFlow's):
    # fetching it all would time a device-to-host copy.
    return lambda: ops.convert_to_numpy(ops.cast(ops.matmul(a, b)[0, 0], "float32"))


def _model(variant, image_size, precision, num_layers, scan_layers):
    config = keras_vit.decode_variant(variant).replace(image_size=image_size, scan_layers=scan_layers)
    if num_layers:
        config = config.replace(num_layers=num_layers)
    keras.mixed_precision.set_global_policy(precision)
    try:
        return keras_vit.ViT(config, classifier_activation=None)
    finally:
        keras.mixed_precision.set_global_policy("float32")


def _compiled_call(model, compiled):
    """The model's forward pass as one function: XLA-compiled when `compiled` (off: TF graph, or JAX eager)."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        return tf.function(model, jit_compile=compiled)
    if BACKEND == "jax":
        import jax

        def forward(trainable, non_trainable, images):
            return model.stateless_call(trainable, non_trainable, images)[0]

        state = ([v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables])
        forward = jax.jit(forward) if compiled else forward
        return lambda images: forward(*state, images)
    if BACKEND == "torch" and not compiled:  # eager, as timm's side runs without torch.compile
        import torch

        def forward(images):
            with torch.no_grad():
                return model(images, training=False)

        return forward
    raise ValueError(f"the benchmark runs keras_vit on the tensorflow or jax backend, or eager on torch; "
                     f"KERAS_BACKEND={BACKEND!r}, compiled={compiled}")


def inference(variant, batch, image_size, compiled=True, precision="float32", num_layers=None, scan_layers=False):
    """`compiled` asks for XLA (`jit_compile=True`, `jax.jit`)."""
    model = _compiled_call(_model(variant, image_size, precision, num_layers, scan_layers), compiled)
    images = keras.random.uniform((batch, image_size, image_size, 3), -1, 1)
    return lambda: ops.convert_to_numpy(model(images))


def _export(variant, image_size, precision, num_layers, scan_layers, jit_compile, folder, export_format="saved_model"):
    """Builds the model and writes `python -m export`'s SavedModel, its OpenVINO IR or its ONNX file under
    `folder`; `folder/path.json` names the SavedModel's version directory, the IR's `.xml` or the `.onnx`."""
    import json

    model = _model(variant, image_size, precision, num_layers, scan_layers)
    images = np.random.default_rng(0).uniform(-1, 1, (2, image_size, image_size, 3)).astype(np.float32)
    if export_format == "openvino":
        from export import openvino as openvino_export

        path = openvino_export.export_openvino(model, os.path.join(folder, "ir"), images)["xml_path"]
    elif export_format == "onnx":
        from export import onnx as onnx_export

        path = onnx_export.export_onnx(model, os.path.join(folder, "onnx"), images)["onnx_path"]
    else:
        from export import saved_model

        path = saved_model.export_saved_model(model, folder, jit_compile=jit_compile)
    with open(os.path.join(folder, "path.json"), "w") as f:
        json.dump(str(path), f)


def training(variant, batch, image_size, compiled=True, precision="float32", num_layers=None, scan_layers=False):
    """AdamW as Keras' own path runs it (`compile("adamw")` gives this class on TensorFlow), with timm's side's
    learning rate and torch's default decay on every weight."""
    model = _model(variant, image_size, precision, num_layers, scan_layers)
    model.compile(optimizer=keras_vit.optimizers.AdamW(1e-4, weight_decay=0.01), jit_compile=compiled,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    images = keras.random.uniform((batch, image_size, image_size, 3), -1, 1)
    labels = ops.convert_to_tensor(np.arange(batch) % 1000)
    return lambda: model.train_on_batch(images, labels)


if __name__ == "__main__":  # the served rows' export, in a process of its own (`benchmarks.served_export`)
    import json

    _export(**json.loads(sys.argv[1]))
