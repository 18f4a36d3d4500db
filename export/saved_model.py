"""SavedModel export for TF Serving: image bytes in, labels out.

The export follows Model Garden's `export_base.get_inference_signatures`
convention: one signature per input kind, the model's own preprocessing
inside the graph, and the TF Serving layout `BASE/NAME/VERSION/`.

Signatures of a classifier (inputs -> outputs):
- `serving_default`: `images` (string [N]: JPEG, PNG, GIF, BMP or still WebP bytes, any size).
- `predict_pixels`: `pixels` (uint8 [N, h, w, C], any size, 0-255).
- `predict_float`: `inputs` (float32 [N, H, W, C] already scaled, `(p / 255 -
  mean) / std`: [-1, 1] for the official mean and std; the model's own input,
  what TFLite takes; any H, W for `dynamic_image_size`). Values outside that
  range by more than a quarter of its width (raw pixels, say) are refused
  with InvalidArgument naming both ranges (`check_input_range`).
- `embeddings`: `images` (string [N]) -> `embeddings` [N, D] (pooled features).
The classification signatures return `probabilities` [N, classes],
`top_k_classes` int32 [N, k], `top_k_scores` [N, k] and, when labels are
given, `top_k_labels` string [N, k] from a labels file shipped as an asset.
A headless model (`include_top=False`) has one signature, `features`:
`images` (string [N]) -> `features` [N, D]. With `jit_compile` every
signature runs the model under XLA (TF Serving: `--xla_cpu_compilation_enabled`).

TF Serving loads a version with the C++ `LoadSavedModel`, which restores the
variables through the SavedModel's saver and runs the signatures' graphs.
Keras 3 variables wrap a `tf.Variable`; saving the Keras model itself writes
each weight twice (the wrapper and its value), and the graphs read the copy
the saver never restores. So the saved object holds the `tf.Variable`s the
graphs capture, and never the Keras model (as Keras' own `model.export` does).
"""

import dataclasses
import json
import os
import pathlib
import shutil

import keras
import numpy as np
import tensorflow as tf

from export import preprocessing as prep
from export import serving_check
from export.common import check_finite_weights, check_labels, is_classifier
from keras_vit.model import head_input, outputs_probabilities
from keras_vit.preprocessing import RANGE_MARGIN
from keras_vit.trim import trim_last_block

METADATA = "keras_vit_export.json"
METADATA_KEYS = ("preprocessing", "signatures", "classes", "top_k", "labels", "jit_compile")  # the export's own
DEFAULT_TOP_K = 5
WARMUP = serving_check.WARMUP


class ServingFunctions:
    """The Keras model with its preprocessing and outputs, as tf.functions keyed by signature name."""

    def __init__(self, model, preprocessing, labels_table=None, top_k=5, jit_compile=False, check_input_range=True):
        self.model = model
        self.check_input_range = check_input_range
        self.jit_compile = jit_compile
        self._forwards = {}  # one per Keras model: signatures of the same input shape share its XLA compilation
        self.preprocessing = preprocessing
        self.labels = labels_table
        self.top_k = top_k
        # Traced once for every signature that takes encoded images: the graph holds the decoder once.
        self._images = tf.function(lambda images: prep.images_to_inputs(images, preprocessing), autograph=False,
                                   input_signature=[tf.TensorSpec([None], tf.string)])
        classifier = is_classifier(model)
        self.outputs_probabilities = classifier and outputs_probabilities(model)  # refused here: before any work
        self.functions = self._classifier() if classifier else self._features()

    def _run(self, model, inputs):
        if model.name not in self._forwards:
            self._forwards[model.name] = _forward(model, self.jit_compile)
        return _call(self._forwards[model.name], inputs, model.output_shape[1:])

    def _classify(self, inputs):
        scores = self._run(self.model, inputs)
        probabilities = scores if self.outputs_probabilities else tf.nn.softmax(scores)
        top = tf.math.top_k(probabilities, k=self.top_k)
        outputs = {"probabilities": probabilities, "top_k_classes": top.indices, "top_k_scores": top.values}
        if self.labels is not None:
            outputs["top_k_labels"] = self.labels.lookup(tf.cast(top.indices, tf.int64))
        return outputs

    def _classifier(self):
        p = self.preprocessing
        fixed = self.model.input_shape[1:3]
        feature_model = keras.Model(self.model.input, head_input(self.model)[0])
        return {
            "serving_default": _signature(lambda images: self._classify(self._images(images)),
                                          "images", tf.string, [None]),
            "predict_pixels": _signature(lambda pixels: self._classify(prep.pixels_to_inputs(pixels, p)),
                                         "pixels", tf.uint8, [None, None, None, p.channels]),
            "predict_float": _signature(lambda inputs: self._classify(self._in_range(inputs)), "inputs",
                                        tf.float32, [None, *fixed, p.channels]),
            "embeddings": _signature(lambda images: {"embeddings": self._run(feature_model, self._images(images))},
                                     "images", tf.string, [None]),
        }

    def _in_range(self, inputs):
        return in_range(inputs, self.preprocessing.input_range) if self.check_input_range else inputs

    def _features(self):
        return {"features": _signature(lambda images: {"features": self._run(self.model, self._images(images))},
                                       "images", tf.string, [None])}


def _signature(fn, name, dtype, shape):
    """tf.function of `fn` on one input `name`, whose rank and fixed sizes are checked when it runs.

    The signature declares any shape: TF Serving's Session::Run does not check
    a request against the declared shape, and a declared one lets the graph
    optimiser fold a check of it away, so a request of the wrong rank would
    reach the convolution and abort the server instead of being refused.
    """
    def checked(value):
        return fn(_expect(value, shape, name))

    function = tf.function(checked, input_signature=[tf.TensorSpec(None, dtype, name=name)])
    function.expected_shape = {name: shape}
    return function


def _expect(value, shape, name):
    """`value`, after a run-time check that it has `shape` (None: any size), with that static shape."""
    wanted = "[" + ", ".join("N" if i == 0 and d is None else "any" if d is None else str(d)
                             for i, d in enumerate(shape)) + "]"
    rank = len(shape)
    # Padded so that reading the sizes cannot fail before the check has run.
    sizes = tf.concat([tf.shape(value), tf.zeros([rank], tf.int32)], 0)[:rank]
    fixed = [i for i, size in enumerate(shape) if size is not None]
    right = tf.logical_and(tf.equal(tf.rank(value), rank), tf.reduce_all(tf.equal(
        tf.gather(sizes, tf.constant(fixed, tf.int32)), tf.constant([shape[i] for i in fixed], tf.int32))))
    check = tf.debugging.Assert(right, [f"{name} must have shape {wanted}; received shape", tf.shape(value)],
                                summarize=8)
    with tf.control_dependencies([check]):
        value = tf.identity(value)
    value.set_shape(shape)
    return value


def in_range(inputs, expected):
    """`inputs`, after a run-time check that every value lies in `expected` (low, high) widened by RANGE_MARGIN.

    The margin (`keras_vit.preprocessing.RANGE_MARGIN`) is the Keras model's `predict` check's.

    NaN fails the check too. An empty batch passes.
    """
    low, high = expected
    margin = RANGE_MARGIN * (high - low)
    inside = tf.reduce_all(tf.logical_and(inputs >= low - margin, inputs <= high + margin))
    check = tf.debugging.Assert(inside, [
        f"inputs must be scaled model inputs, in [{low:.4g}, {high:.4g}] ((pixels / 255 - mean) / std; "
        "raw pixels go to predict_pixels); received values from", tf.reduce_min(inputs), "to",
        tf.reduce_max(inputs)])
    with tf.control_dependencies([check]):
        return tf.identity(inputs)


def _forward(model, jit_compile):
    """`model` in inference mode; with `jit_compile`, one XLA cluster compiled once per input shape.

    The preprocessing around it stays in the graph (XLA has no string or decode ops).
    """
    def forward(inputs):
        return model(inputs, training=False)

    return tf.function(forward, jit_compile=True) if jit_compile else forward


def _call(forward, inputs, output_shape):
    """float32 `forward(inputs)`; an empty batch gives an empty answer (TF's Conv2D returns its input for one)."""
    return tf.cond(tf.shape(inputs)[0] > 0,
                   lambda: tf.cast(forward(inputs), tf.float32),
                   lambda: tf.zeros([0, *output_shape], tf.float32))


def next_version(model_base):
    """1 + the largest numeric version under `model_base` (1 when there is none)."""
    versions = [int(p.name) for p in pathlib.Path(model_base).glob("*") if p.name.isdigit()]
    return max(versions, default=0) + 1


def warmup_requests(functions, preprocessing, images=None):
    """One request per signature, (signature, {input: numpy}): replayed by TF Serving at load and by the check."""
    images = images or sample_images(preprocessing)
    encoded = np.array(images, dtype=object)
    if "features" in functions:
        return [("features", {"images": encoded})]
    pixels = np.stack([tf.io.decode_image(images[0], channels=preprocessing.channels,
                                          expand_animations=False).numpy()] * 2)
    inputs = prep.pixels_to_inputs(tf.constant(pixels), preprocessing).numpy()
    return [("serving_default", {"images": encoded}), ("predict_pixels", {"pixels": pixels}),
            ("predict_float", {"inputs": inputs}), ("embeddings", {"images": encoded})]


def write_warmup(path, model_name, requests):
    """`assets.extra/tf_serving_warmup_requests`: PredictionLogs TF Serving replays at load."""
    from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

    with tf.io.TFRecordWriter(str(path)) as writer:
        for signature, inputs in requests:
            request = predict_pb2.PredictRequest(
                model_spec=model_pb2.ModelSpec(name=model_name, signature_name=signature))
            for key, value in inputs.items():
                dtype = tf.string if value.dtype == object else None
                request.inputs[key].CopyFrom(tf.make_tensor_proto(list(value) if dtype else value, dtype=dtype))
            log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(log.SerializeToString())


def sample_images(preprocessing, count=2):
    """Small smooth JPEG and PNG images of another size than the model's, for warm-up and self-checks."""
    height, width = (s + 5 for s in preprocessing.image_size)
    y, x = np.meshgrid(np.linspace(0, 255, height), np.linspace(0, 255, width), indexing="ij")
    planes = [x, y, 255 - x][: preprocessing.channels] if preprocessing.channels > 1 else [x]
    image = np.stack(planes, -1).astype(np.uint8)
    encoders = (tf.io.encode_jpeg, tf.io.encode_png)
    return [encoders[i % 2](image).numpy() for i in range(count)]


def _check_arguments(model, labels, top_k, metadata):
    """Refuses what the export could not serve honestly; returns (labels, top_k) (top_k None: 5, or fewer classes)."""
    labels = None if labels is None else check_labels(labels, model)
    clashes = sorted(set(metadata or {}) & set(METADATA_KEYS))
    if clashes:
        raise ValueError(f"`metadata` must not set the keys the export writes; received keys {clashes}")
    check_finite_weights(model)
    if is_classifier(model):
        outputs_probabilities(model)  # a head that is neither softmax nor logits is refused here
        classes = model.output_shape[-1]
        if top_k is None:
            return labels, min(DEFAULT_TOP_K, classes)
        if not (isinstance(top_k, int) and 1 <= top_k <= classes):
            raise ValueError(f"top_k must be an integer from 1 to the {classes} classes; received {top_k!r}")
    return labels, top_k


def _check_output(model_base, version, overwrite):
    """Refuses an existing version (unless `overwrite`) or an unwritable directory; returns the version's path."""
    # TF Serving's versions are integers >= 0; 0 is a version like any other.
    if not (isinstance(version, int) and not isinstance(version, bool) and version >= 0):
        raise ValueError(f"version must be an integer >= 0 (TF Serving's version directories); received {version!r}")
    final = model_base / str(version)
    if final.exists() and not overwrite:
        raise ValueError(f"Version {version} of {model_base.name!r} exists at {final}; "
                         "choose another --version or pass --overwrite")
    try:
        model_base.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(f"Cannot create the export directory {model_base}: {error.strerror}") from error
    if not os.access(model_base, os.W_OK | os.X_OK):
        raise ValueError(f"The export directory {model_base} is not writable")
    return final


def export_saved_model(model, base_dir, name="vit", version=None, labels=None, crop_fraction=1.0,
                       top_k=None, warmup_images=None, metadata=None, max_image_pixels=prep.DEFAULT_MAX_IMAGE_PIXELS,
                       overwrite=False, jit_compile=False, check_input_range=True):
    """Writes `model` to `base_dir/name/version/` for TF Serving; returns the path.

    The version directory appears only when complete and proven: written under
    a temporary name, loaded by a fresh process through TensorFlow's C API (TF
    Serving's loader), its warm-up requests answered there and compared with
    the Keras model (1e-5), then renamed. A failure leaves no version behind.
    A class-token head is served by `keras_vit.trim_last_block(model)`, which
    gives the model's answers with less work.

    Args:
        model: a Keras model from keras_vit (a classifier, or `include_top=False`).
        base_dir: TF Serving's model base path.
        name: the model name (a directory under `base_dir`).
        version: int, or None for the next free version.
        labels: optional list of class names (index order), shipped as an asset.
        crop_fraction: centre crop applied to decoded images, in (0, 1] (1.0: none).
        top_k: number of classes in the top-k outputs, 1 to the number of classes
            (default: 5, or all classes when there are fewer).
        warmup_images: encoded images for the warm-up records (default: two made here).
        metadata: extra fields stored in the metadata file.
        max_image_pixels: largest width x height a request image may declare.
        overwrite: replace an existing `version` (swapped in only once the new one is proven).
        jit_compile: run the model under XLA in every signature: faster on a CPU, but TF Serving
            refuses it unless started with `--xla_cpu_compilation_enabled=true` (its default disables
            XLA), and each new batch size compiles on its first request.
        check_input_range: refuse `predict_float` inputs outside the model's scaled range (see above).
    """
    model_base = pathlib.Path(base_dir) / name
    version = next_version(model_base) if version is None else version
    preprocessing = prep.Preprocessing.for_model(model, crop_fraction, max_image_pixels)
    labels, top_k = _check_arguments(model, labels, top_k, metadata)
    model = trim_last_block(model)  # the same answers for less work (keras_vit.trim)
    created = [folder for folder in (model_base, *model_base.parents) if not folder.exists()]  # deepest first
    final = _check_output(model_base, version, overwrite)
    staging = model_base / f".tmp-{version}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.mkdir()
        functions = _save(model, staging, preprocessing, labels, top_k, jit_compile, check_input_range)
        requests = warmup_requests(functions.functions, preprocessing, warmup_images)
        if jit_compile:  # XLA compiles once per batch size: warm single-image requests too
            requests += [(signature, {key: value[:1] for key, value in inputs.items()})
                         for signature, inputs in requests]
        extra = staging / "assets.extra"
        extra.mkdir()
        write_warmup(extra / WARMUP, name, requests)
        info = {"preprocessing": dataclasses.asdict(preprocessing),
                "signatures": {name: fn.expected_shape for name, fn in functions.functions.items()},
                "classes": model.output_shape[-1] if is_classifier(model) else None,
                "top_k": top_k if is_classifier(model) else None, "labels": labels is not None,
                "jit_compile": jit_compile}
        info.update(metadata or {})
        (extra / METADATA).write_text(json.dumps(info, indent=2))
        serving_check.check(staging, functions.functions, requests, xla=jit_compile)
        _publish(staging, final, overwrite)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if not final.exists():  # failed: the folders made for it go too, unless something else is now in them
            for folder in created:
                try:
                    folder.rmdir()
                except OSError:
                    break
    return final


def from_command_line(model, request):
    """`python -m export --format=saved_model`: writes the next (or `--version`) version and prints its signatures."""
    options = request.options
    path = export_saved_model(
        model, request.output, options["name"], options["version"], request.labels, request.crop_fraction,
        options["top_k"], metadata=request.metadata, max_image_pixels=options["max_image_pixels"],
        overwrite=options["overwrite"], jit_compile=options["jit_compile"])
    print(f"SavedModel written to {path} (served through TensorFlow's C API and checked against Keras)")
    print(inspect(path))


def _save(model, path, preprocessing, labels, top_k, jit_compile, check_input_range=True):
    """tf.saved_model.save of the signatures, with the variables and the labels table they use."""
    root = tf.Module()
    root.model_variables = [variable.value for variable in model.variables]  # the tf.Variables the graphs read
    table = None
    if labels is not None:
        labels_path = path / "labels.txt"
        labels_path.write_text("\n".join(labels) + "\n")
        root.labels_asset = tf.saved_model.Asset(str(labels_path))
        table = root.labels_table = tf.lookup.StaticHashTable(
            tf.lookup.TextFileInitializer(root.labels_asset, tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER,
                                          tf.string, tf.lookup.TextFileIndex.WHOLE_LINE),
            default_value="")
    functions = ServingFunctions(model, preprocessing, table, top_k, jit_compile, check_input_range)
    signatures = {name: fn.get_concrete_function() for name, fn in functions.functions.items()}
    tf.saved_model.save(root, str(path), signatures=signatures)
    if labels is not None:
        (path / "labels.txt").unlink()  # the SavedModel keeps its own copy under assets/
    return functions


def _publish(staging, final, overwrite):
    """Renames the proven export to its version; an existing one (--overwrite) is swapped out first."""
    if not overwrite:
        try:
            os.rename(staging, final)  # onto a version with files, the rename fails: nothing is replaced
        except OSError as error:
            if final.exists():
                raise ValueError(f"Version {final.name} appeared at {final} while this export ran (another "
                                 "export?) and was kept; choose another --version or pass --overwrite") from error
            raise
        return
    if final.exists():
        retired = final.with_name(f".old-{final.name}-{os.getpid()}")
        os.rename(final, retired)
        os.rename(staging, final)
        shutil.rmtree(retired)
    else:
        os.rename(staging, final)


def inspect(path):
    """Human-readable description of an export: metadata and signatures, as TF Serving loads them."""
    from export import capi

    path = pathlib.Path(path)
    lines = [f"SavedModel {path}"]
    meta = path / "assets.extra" / METADATA
    if meta.exists():
        lines.append("metadata: " + meta.read_text())
    session = capi.SavedModelSession(path)
    try:
        for name, signature in sorted(session.signatures.items()):
            if name.startswith("__"):
                continue
            lines.append(f"signature {name}: inputs {capi.describe(signature.inputs)} -> "
                         f"outputs {capi.describe(signature.outputs)}")
    finally:
        session.close()
    return "\n".join(lines)
