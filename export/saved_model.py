"""SavedModel export for TF Serving: image bytes in, labels out.

The export follows Model Garden's `export_base.get_inference_signatures`
convention: one signature per input kind, the model's own preprocessing
inside the graph, and the TF Serving layout `BASE/NAME/VERSION/`.

Signatures (inputs -> outputs):
- `serving_default`: `images` (string [N]: JPEG or PNG bytes, any size).
- `predict_pixels`: `pixels` (uint8 [N, h, w, C], any size, 0-255).
- `predict_float`: `inputs` (float32 [N, H, W, C] already in [-1, 1]: the
  model's own input, fixed size, what TFLite takes).
- `embeddings`: `images` (string [N]) -> `embeddings` [N, D] (pooled features).
The classification signatures return `probabilities` [N, classes],
`top_k_classes` int32 [N, k], `top_k_scores` [N, k] and, when labels are
given, `top_k_labels` string [N, k] from a labels file shipped as an asset.
"""

import dataclasses
import json
import os
import pathlib
import shutil

import keras
import numpy as np
import tensorflow as tf

from export.loading import outputs_probabilities
from keras_vit.preprocessing import INPUT_RANGE, resize_and_center_crop

METADATA = "keras_vit_export.json"


@dataclasses.dataclass(frozen=True)
class Preprocessing:
    """How raw pixels become model inputs; stored with every export."""

    # Model resolution (height, width) and channels.
    image_size: tuple
    channels: int
    # Fraction of the short side kept by the centre crop (1.0: resize the whole image).
    crop_fraction: float = 1.0
    # Resize filter.
    interpolation: str = "bilinear"
    # Pixels p in [0, 255] become (p / 255 - mean) / std: [-1, 1] for the official checkpoints.
    mean: float = 0.5
    std: float = 0.5
    input_range: tuple = INPUT_RANGE

    @classmethod
    def for_model(cls, model, crop_fraction=1.0):
        _, height, width, channels = model.input_shape
        return cls((height, width), channels, crop_fraction)


class ServingModule(tf.Module):
    """The Keras model with its preprocessing and outputs, as tf.functions."""

    def __init__(self, model, preprocessing, labels_path=None, top_k=5):
        super().__init__()
        self.model = model
        features = "pre_logits" if any(l.name == "pre_logits" for l in model.layers) else "pooling"
        self.feature_model = keras.Model(model.inputs, model.get_layer(features).output)
        self.preprocessing = preprocessing
        self.softmax_in_model = outputs_probabilities(model)
        self.top_k = min(top_k, model.output_shape[-1])
        self.labels = None
        if labels_path:
            self.labels_asset = tf.saved_model.Asset(str(labels_path))
            self.labels = tf.lookup.StaticHashTable(
                tf.lookup.TextFileInitializer(
                    self.labels_asset, tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER,
                    tf.string, tf.lookup.TextFileIndex.WHOLE_LINE),
                default_value="")

    def _resize(self, pixels):
        """One [h, w, C] image in 0-255 -> model size, centre-cropped, in [-1, 1]."""
        p = self.preprocessing
        pixels = resize_and_center_crop(tf.cast(pixels, tf.float32), p.image_size, p.crop_fraction, p.interpolation)
        return (pixels / 255.0 - p.mean) / p.std

    def _decode(self, index, data):
        # Checked before decoding so the error names the bad element and the
        # server goes on with the next request.
        png = tf.equal(tf.strings.substr(data, 0, 8), b"\x89PNG\r\n\x1a\n")
        tf.debugging.Assert(tf.logical_or(tf.io.is_jpeg(data), png),
                            ["images element", index, "is not a JPEG or PNG image"])
        image = tf.io.decode_image(data, channels=self.preprocessing.channels, expand_animations=False)
        return self._resize(image)

    def _images_to_inputs(self, images):
        indices = tf.range(tf.shape(images)[0])
        return tf.map_fn(lambda args: self._decode(*args), (indices, images),
                         fn_output_signature=tf.TensorSpec([*self.preprocessing.image_size,
                                                            self.preprocessing.channels], tf.float32))

    def _classify(self, inputs):
        scores = self.model(inputs, training=False)
        probabilities = scores if self.softmax_in_model else tf.nn.softmax(tf.cast(scores, tf.float32))
        top = tf.math.top_k(probabilities, k=self.top_k)
        outputs = {"probabilities": probabilities, "top_k_classes": top.indices, "top_k_scores": top.values}
        if self.labels is not None:
            outputs["top_k_labels"] = self.labels.lookup(tf.cast(top.indices, tf.int64))
        return outputs

    def signatures(self):
        """The concrete functions to save, keyed by signature name."""
        height, width = self.preprocessing.image_size
        channels = self.preprocessing.channels

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="images")])
        def serve_bytes(images):
            return self._classify(self._images_to_inputs(images))

        @tf.function(input_signature=[tf.TensorSpec([None, None, None, channels], tf.uint8, name="pixels")])
        def serve_pixels(pixels):
            return self._classify(tf.map_fn(self._resize, pixels, fn_output_signature=tf.TensorSpec(
                [height, width, channels], tf.float32)))

        @tf.function(input_signature=[tf.TensorSpec([None, height, width, channels], tf.float32, name="inputs")])
        def serve_float(inputs):
            return self._classify(inputs)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="images")])
        def serve_embeddings(images):
            features = self.feature_model(self._images_to_inputs(images), training=False)
            return {"embeddings": tf.cast(features, tf.float32)}

        return {"serving_default": serve_bytes, "predict_pixels": serve_pixels,
                "predict_float": serve_float, "embeddings": serve_embeddings}


def next_version(model_base):
    """1 + the largest numeric version under `model_base` (1 when there is none)."""
    versions = [int(p.name) for p in pathlib.Path(model_base).glob("*") if p.name.isdigit()]
    return max(versions, default=0) + 1


def write_warmup(path, model_name, images):
    """`assets.extra/tf_serving_warmup_requests`: PredictionLogs TF Serving replays at load."""
    from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

    with tf.io.TFRecordWriter(str(path)) as writer:
        for data in images:
            request = predict_pb2.PredictRequest(
                model_spec=model_pb2.ModelSpec(name=model_name, signature_name="serving_default"))
            request.inputs["images"].CopyFrom(tf.make_tensor_proto([data], dtype=tf.string))
            log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(log.SerializeToString())


def _sample_images(preprocessing, count=2):
    """Small smooth JPEG and PNG images for warm-up and self-checks."""
    height, width = preprocessing.image_size
    y, x = np.meshgrid(np.linspace(0, 255, height), np.linspace(0, 255, width), indexing="ij")
    planes = [x, y, 255 - x][: preprocessing.channels] if preprocessing.channels > 1 else [x]
    image = np.stack(planes, -1).astype(np.uint8)
    encoders = (tf.io.encode_jpeg, tf.io.encode_png)
    return [encoders[i % 2](image).numpy() for i in range(count)]


def export_saved_model(model, base_dir, name="vit", version=None, labels=None, crop_fraction=1.0,
                       top_k=5, warmup_images=None, metadata=None):
    """Writes `model` to `base_dir/name/version/` for TF Serving; returns the path.

    The version directory appears only when complete (written under a
    temporary name, reloaded and checked against Keras, then renamed); an
    existing version is never overwritten.

    Args:
        model: a Keras classification model from keras_vit.
        base_dir: TF Serving's model base path.
        name: the model name (a directory under `base_dir`).
        version: int, or None for the next free version.
        labels: optional list of class names (index order), shipped as an asset.
        crop_fraction: centre crop applied to decoded images (1.0: none).
        top_k: number of classes in the top-k outputs.
        warmup_images: encoded images for the warm-up records (default: two made here).
        metadata: extra fields stored in the metadata file.
    """
    model_base = pathlib.Path(base_dir) / name
    version = next_version(model_base) if version is None else int(version)
    final = model_base / str(version)
    if final.exists():
        raise ValueError(f"Version {version} of {name!r} exists at {final}; choose another --version")
    if labels is not None and len(labels) != model.output_shape[-1]:
        raise ValueError(f"The model has {model.output_shape[-1]} classes; received {len(labels)} labels")
    model_base.mkdir(parents=True, exist_ok=True)
    staging = model_base / f".tmp-{version}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.mkdir()
        labels_path = None
        if labels is not None:
            labels_path = staging / "labels.txt"
            labels_path.write_text("\n".join(labels) + "\n")
        preprocessing = Preprocessing.for_model(model, crop_fraction)
        module = ServingModule(model, preprocessing, labels_path, top_k)
        tf.saved_model.save(module, str(staging), signatures=module.signatures())
        if labels_path:
            labels_path.unlink()  # the SavedModel keeps its own copy under assets/
        extra = staging / "assets.extra"
        extra.mkdir()
        warmup = warmup_images or _sample_images(preprocessing)
        write_warmup(extra / "tf_serving_warmup_requests", name, warmup)
        info = {"preprocessing": dataclasses.asdict(preprocessing), "classes": model.output_shape[-1],
                "top_k": module.top_k, "labels": labels is not None, **(metadata or {})}
        (extra / METADATA).write_text(json.dumps(info, indent=2))
        _check_reloaded(staging, module, warmup)
        os.rename(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def _check_reloaded(path, module, images):
    """The reloaded SavedModel must give the module's probabilities (1e-5)."""
    reloaded = tf.saved_model.load(str(path)).signatures["serving_default"]
    got = reloaded(images=tf.constant(images))["probabilities"].numpy()
    want = module._classify(module._images_to_inputs(tf.constant(images)))["probabilities"].numpy()
    if not np.allclose(got, want, atol=1e-5):
        raise RuntimeError(f"The reloaded SavedModel differs from Keras by {np.abs(got - want).max():.2e}")


def inspect(path):
    """Human-readable description of an export: metadata and signatures."""
    path = pathlib.Path(path)
    lines = [f"SavedModel {path}"]
    meta = path / "assets.extra" / METADATA
    if meta.exists():
        lines.append("metadata: " + meta.read_text())
    loaded = tf.saved_model.load(str(path))
    for name, fn in loaded.signatures.items():
        inputs = {k: f"{v.dtype.name}{v.shape}" for k, v in fn.structured_input_signature[1].items()}
        outputs = {k: f"{v.dtype.name}{v.shape}" for k, v in fn.structured_outputs.items()}
        lines.append(f"signature {name}: inputs {inputs} -> outputs {outputs}")
    return "\n".join(lines)
