"""What every checked export shares: its argument checks, the score comparison, and writing whole or not at all.

A file export (TFLite, OpenVINO, ONNX) takes the model's own input, float32
`(batch, height, width, channels)` scaled by `keras_vit.preprocess_input`,
returns float32 `scores`, and is run in its own runtime on real images and
compared with Keras before its directory appears. The SavedModel export
shares the label checks; its own check is TensorFlow's C API (`serving_check`).
"""

import dataclasses
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from export.preprocessing import Preprocessing
from keras_vit.atomic_files import new_directory
from keras_vit.model import outputs_probabilities

# A float export computes what Keras computes, up to the order of float operations.
FLOAT_TOLERANCE = dict(max_abs=1e-4, agreement=1.0)
LABELS_FILE, METADATA_FILE = "labels.txt", "metadata.json"


@dataclasses.dataclass(frozen=True)
class Request:
    """What `python -m export` asks a format's `from_command_line(model, request)` for, its flags checked.

    `images` and `calibration`: the decoded, scaled `--images` and `--calibration_images` (None for a format not
    checked on images, which applies `crop_fraction` to its requests); `metadata`: the source and preprocessing
    fields every metadata.json records; `options`: the values of the format's own flags (`choices.Format.flags`).
    """

    output: str
    labels: list | None
    metadata: dict
    images: np.ndarray | None = None
    calibration: np.ndarray | None = None
    crop_fraction: float = 1.0
    options: dict = dataclasses.field(default_factory=dict)


class ToleranceError(ValueError):
    """A converted model is not within its stated tolerance of the Keras model, so nothing was written."""


class ModelError(ValueError):
    """The model itself cannot be exported (not the arguments, nor a converter)."""


def is_classifier(model):
    """Whether `model` ends in keras_vit's classification head (not `include_top=False`)."""
    return any(layer.name == "head" for layer in model.layers)


def check_labels(labels, model):
    """`labels` as strings, once they name `model`'s classes one to one; raises ValueError naming what is wrong."""
    if not is_classifier(model):
        raise ValueError("The model has no classification head (include_top=False): it exports features, "
                         "and labels have nothing to name; received labels")
    classes = int(model.output_shape[-1])
    labels = [str(label) for label in labels]
    if len(labels) != classes:
        raise ValueError(f"The model has {classes} classes; received {len(labels)} labels")
    for index, label in enumerate(labels):
        if "\n" in label or "\r" in label:  # it would shift every later label by a line
            raise ValueError(f"Each label must be one line of the labels file; label {index} holds a line "
                             f"break: {label!r}")
    return labels


def check_finite_weights(model):
    """Raises ModelError naming the first weight of `model` that holds NaN or infinity.

    A converter would carry it into every score, and the check against Keras
    (NaN against NaN) would blame the conversion for the model's own fault.
    """
    for variable in model.weights:
        if "float" not in str(variable.dtype):
            continue
        finite = np.isfinite(np.asarray(variable, np.float32))
        if not finite.all():
            raise ModelError(f"The model's weight {variable.path!r} holds {finite.size - finite.sum()} non-finite "
                             f"value(s) (NaN or infinity) of its {finite.size}: it gives no scores to export. "
                             "Export a checkpoint written before the weights diverged")


def input_shape(model):
    """The batch-1 input shape `(1, height, width, channels)` of a model with one fixed-size image input."""
    shape = tuple(model.input_shape)
    if len(shape) != 4 or None in shape[1:]:
        raise ValueError(
            "This export needs one image input of fixed (height, width, channels) "
            f"(build the model with dynamic_image_size=False); received input_shape={shape}"
        )
    return (1, *shape[1:])


def check_images(images, model, name):
    """Returns `images` as float32 `(n, height, width, channels)`, n >= 1, matching `model`."""
    expected = input_shape(model)[1:]
    images = np.asarray(images, np.float32)
    if images.ndim != 4 or images.shape[1:] != expected or len(images) == 0:
        raise ValueError(
            f"`{name}` must be float pixels of shape (n >= 1, {', '.join(map(str, expected))}); "
            f"received shape {images.shape}"
        )
    # Pixels not yet scaled would be checked on inputs the model never sees (and calibrate int8 to them).
    low, high = Preprocessing.for_model(model).input_range
    if not (np.isfinite(images).all() and images.min() >= low - 1e-3 and images.max() <= high + 1e-3):
        raise ValueError(
            f"`{name}` must be the model's inputs, in [{low:.3g}, {high:.3g}] (pixels scaled by "
            f"keras_vit.preprocess_input); received values in [{images.min():.3g}, {images.max():.3g}]"
        )
    return images


def check_export_arguments(model, output_dir, verify_images, labels, kind):
    """A checked file export's arguments, before any work; returns the absolute `output_dir`, the images and the
    labels. `kind` names the format in messages."""
    output_dir = os.path.abspath(os.fspath(output_dir))
    if os.path.lexists(output_dir):
        raise ValueError(f"`output_dir` must not exist (exports are never overwritten); received {output_dir!r}")
    if verify_images is None:
        raise ValueError(
            f"Every {kind} export is checked against the Keras model: `verify_images` must be float "
            "images of shape (n, height, width, channels); received verify_images=None"
        )
    if not is_classifier(model):
        raise ValueError(f"The model has no classification head (include_top=False): {kind} exports are checked "
                         "by their class predictions against Keras', and features have none. Export the features as a "
                         "SavedModel (its `features` signature is checked against Keras to 1e-5)")
    outputs_probabilities(model)  # a head that is neither softmax nor logits is refused here, before any work
    verify_images = check_images(verify_images, model, "verify_images")
    if labels is not None:
        labels = check_labels(labels, model)
    check_finite_weights(model)
    return output_dir, verify_images, labels


def check_metadata(metadata, ours):
    """`metadata` merged under the export's own keys `ours`, which it must not set."""
    clashes = sorted(set(metadata or {}) & set(ours))
    if clashes:
        raise ValueError(f"`metadata` must not set the keys the export writes; received keys {clashes}")
    return {**(metadata or {}), **ours}


def keras_scores(model, images):
    """The Keras model's float32 scores on `images`: what every export is compared with."""
    return np.asarray(model.predict(images, batch_size=32, verbose=0), np.float32)


def softmax(logits):
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def compare(model, expected, received):
    """`max_abs_diff_probabilities` and `top1_agreement` of a converted model's scores against Keras' (`expected`),
    softmax applied to both when `model` returns logits."""
    if received.shape != expected.shape:
        raise ValueError(f"The converted model's scores must have the Keras model's shape {expected.shape}; "
                         f"received shape {received.shape}")
    if not outputs_probabilities(model):
        expected, received = softmax(expected), softmax(received)
    return {"max_abs_diff_probabilities": float(np.max(np.abs(expected - received))),
            "top1_agreement": float(np.mean(expected.argmax(-1) == received.argmax(-1)))}


def tolerance_failures(tolerance, result):
    """The ways `result` (from `compare`) misses `tolerance` (`max_abs`, `agreement`); empty if none."""
    failures = []
    if "max_abs" in tolerance and not result["max_abs_diff_probabilities"] <= tolerance["max_abs"]:
        failures.append(
            f"max |difference| of probabilities {result['max_abs_diff_probabilities']:.3g} "
            f"> {tolerance['max_abs']:.3g}"
        )
    if "agreement" in tolerance and not result["top1_agreement"] >= tolerance["agreement"]:
        failures.append(f"top-1 agreement {result['top1_agreement']:.3f} < {tolerance['agreement']:.3f}")
    return failures


def refuse_unless_within(tolerance, result, kind):
    """Raises ToleranceError when `result` misses a float export's `tolerance`: nothing is written."""
    failures = tolerance_failures(tolerance, result)
    if failures:
        raise ToleranceError(f"The {kind} model is not within {tolerance} of the Keras model on "
                             f"{result['num_images']} images: {'; '.join(failures)}. Nothing was written")


def input_and_output(model, batch=1):
    """The `input` and `output` entries of metadata.json: what the export takes and returns (`batch` None: any)."""
    return {
        "input": {"shape": [batch, *input_shape(model)[1:]], "dtype": "float32",
                  "range": list(Preprocessing.for_model(model).input_range)},
        "output": {
            "shape": [batch, int(model.output_shape[-1])],
            "dtype": "float32",
            "kind": "probabilities" if outputs_probabilities(model) else "logits",
        },
    }


def client_scores(client, path, images, runtime, timeout=600):
    """The scores of the exported file at `path` on `images`, as `client` computes them in a fresh interpreter.

    `client` is Python run with `sys.argv[1:]` = the file, an `.npy` of the images, the `.npy` to save the
    scores to: a process that imports only the runtime and numpy, as a deployment does, so that nothing
    TensorFlow loaded (its threads, its copy of a shared library) stands between the file and its check.
    A failure raises RuntimeError naming `runtime` with the client's last lines.
    """
    with tempfile.TemporaryDirectory(prefix="keras_vit_check_") as folder:
        inputs, outputs = os.path.join(folder, "images.npy"), os.path.join(folder, "scores.npy")
        np.save(inputs, images)
        done = subprocess.run([sys.executable, "-c", client, os.fspath(path), inputs, outputs], capture_output=True,
                              text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{runtime} could not run the exported model: "
                               f"{' | '.join(done.stderr.strip().splitlines()[-3:])}")
        return np.load(outputs)


def write_checked(model, output_dir, verify_images, labels, metadata, *, ours, kind, convert, save, client, runtime):
    """The float file exports' sequence: check the arguments, convert, score the staged file in its runtime's bare
    process, refuse it outside `FLOAT_TOLERANCE`, then publish it with labels.txt and metadata.json.

    `ours`: the export's own metadata.json keys (format, versions); `convert(model)` converts, `save(converted,
    folder)` writes the file into the staging folder and returns its path; `client`: the `client_scores` program
    of `runtime`.
    Returns the check's numbers, `output_dir` and `path` (where the file now lies).
    """
    output_dir, verify_images, labels = check_export_arguments(model, output_dir, verify_images, labels, kind)
    ours = {**ours, "tolerance": dict(FLOAT_TOLERANCE), **input_and_output(model, batch=None)}
    check_metadata(metadata, {**ours, "check": None})
    converted = convert(model)
    expected = keras_scores(model, verify_images)
    with new_directory(output_dir) as staging:  # checked where it will lie, renamed only once it passed
        path = save(converted, staging)
        received = client_scores(client, path, verify_images, runtime)
        result = {**compare(model, expected, received), "num_images": len(verify_images)}
        refuse_unless_within(FLOAT_TOLERANCE, result, kind)
        write_labels_and_metadata(staging, labels, check_metadata(metadata, {**ours, "check": result}))
    return {**result, "output_dir": output_dir, "path": os.path.join(output_dir, os.path.basename(path))}


def check_line(result, written, runtime):
    """What `python -m export` prints of a float file export's check: where it lies and how it matched Keras."""
    return (f"{written}: on {result['num_images']} images, top-1 agreement {result['top1_agreement']:.2%}, max "
            f"|difference| of probabilities {result['max_abs_diff_probabilities']:.2e} ({runtime} against Keras)")


def write_labels_and_metadata(folder, labels, metadata, labels_name=LABELS_FILE, metadata_name=METADATA_FILE):
    """`labels` one per line (when given) and `metadata` as sorted JSON, into `folder`."""
    if labels is not None:
        with open(os.path.join(folder, labels_name), "w") as f:
            f.write("".join(label + "\n" for label in labels))
    with open(os.path.join(folder, metadata_name), "w") as f:
        json.dump(metadata, f, indent=2, sort_keys=True)
