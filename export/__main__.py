"""`python -m export --model=PATH --format=saved_model|tflite|openvino --output=DIR [...]`.

Also `python -m export --inspect=DIR` to print an export's metadata and
signatures. The model is a `.keras` file or any checkpoint keras_vit reads
(official `.npz`, timm / Hugging Face `.safetensors`); a checkpoint's
architecture is read off the file, through keras_vit's own loaders. Every
flag is checked before TensorFlow is imported: a bad one is refused at once.
"""

import dataclasses
import glob
import importlib
import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags, logging  # noqa: E402

from export import choices  # noqa: E402  (TensorFlow loads in main(), once the flags have passed)
from keras_vit.backends import backend_problem  # noqa: E402  (imports Keras when called)
from keras_vit.checks import is_hub_id  # noqa: E402  (Keras-free)

FORMATS = tuple(choices.FORMATS)
_MODEL = flags.DEFINE_string("model", None, "A .keras file, or a checkpoint: an official or big_vision .npz, a timm "
                                            ".safetensors file or model directory, a Hugging Face transformers "
                                            "directory, or a Hugging Face hub id (org/name).")
_IMAGE_SIZE = flags.DEFINE_integer("image_size", None, "Resolution for a checkpoint (default: the checkpoint's).")
_FORMAT = flags.DEFINE_enum("format", "saved_model", FORMATS, "What to write.")
_OUTPUT = flags.DEFINE_string("output", None, "SavedModel: the TF Serving base path; TFLite, OpenVINO: a new "
                                                "directory.")
_NAME = flags.DEFINE_string("name", "vit", "Model name (TF Serving directory under --output).")
_VERSION = flags.DEFINE_integer("version", None, "TF Serving version (default: the next free one).")
_LABELS = flags.DEFINE_string("labels", None, "A text file of class names, one per line, in class order "
                                              "(default: the checkpoint's own, a transformers directory's id2label).")
_TOP_K = flags.DEFINE_integer("top_k", None, "Classes in the top-k outputs, 1 to the number of classes "
                                             "(default: 5, or all classes when there are fewer).")
_CROP = flags.DEFINE_float("crop_fraction", 1.0, "Centre crop of decoded images (1.0: none).")
_QUANTIZE = flags.DEFINE_enum("quantize", "none", list(choices.QUANTIZATIONS), "TFLite quantisation.")
_IMAGES = flags.DEFINE_string("images", None, "Glob of real JPEG/PNG images: TFLite and OpenVINO verification, int8 "
                                              "calibration.")
_CALIBRATION = flags.DEFINE_string("calibration_images", None, "Glob of other real images to calibrate full int8 on "
                                   "(default: --images); apart from the checked ones, the check says what new images "
                                   "get.")
_FORCE = flags.DEFINE_bool("force", False, "Write a TFLite model that misses its agreement threshold.")
_INSPECT = flags.DEFINE_string("inspect", None, "Print the metadata and signatures of an export and exit.")
_MAX_PIXELS = flags.DEFINE_integer("max_image_pixels", choices.DEFAULT_MAX_IMAGE_PIXELS,
                                   "SavedModel: largest width x height a request image may declare in its header; "
                                   "larger ones are refused before decoding.", lower_bound=1)
_JIT_COMPILE = flags.DEFINE_bool("jit_compile", False, "SavedModel: run the model under XLA, faster on a CPU; TF "
                                  "Serving then needs --xla_cpu_compilation_enabled=true (docs/serving.md).")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "SavedModel: replace an existing --version (once the new one "
                                                   "is proven).")


def read_labels(path):
    """The class names of a labels file, one per line (a final newline is not a class)."""
    try:
        return pathlib.Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise app.UsageError(f"--labels={path!r} cannot be read: {error.strerror}") from error
    except UnicodeDecodeError as error:
        raise app.UsageError(f"--labels={path!r} must be UTF-8 text: {error}") from error


def check_flags():
    """Every flag against the others and the files they name, before the model loads.

    Returns the image files of `--images` and `--calibration_images` (TFLite), or None and None.
    """
    if not _MODEL.value or not _OUTPUT.value:
        raise app.UsageError("--model and --output are required (or --inspect=DIR)")
    fmt = _FORMAT.value
    for other in FORMATS:  # a flag of another format only would be ignored
        misplaced = [f"--{name}" for name in choices.FORMATS[other].flags if flags.FLAGS[name].present
                     and name not in choices.FORMATS[fmt].flags]
        if misplaced:
            takers = ", ".join(f for f in FORMATS if set(choices.FORMATS[f].flags) >= {m[2:] for m in misplaced})
            raise app.UsageError(f"{', '.join(misplaced)} apply to --format={takers} only; received --format={fmt}")
    images = calibration = None
    if choices.FORMATS[fmt].images:
        if not _IMAGES.value:
            raise app.UsageError(f"--format={fmt} checks the model on real images: pass --images=GLOB")
        images = sorted(glob.glob(_IMAGES.value))
        if not images:
            raise app.UsageError(f"--images={_IMAGES.value!r} matches no file")
        calibration = images
        if _CALIBRATION.present:
            if _QUANTIZE.value != "int8":
                raise app.UsageError(f"--calibration_images applies to --quantize=int8 only (the others calibrate "
                                     f"nothing); received --quantize={_QUANTIZE.value}")
            calibration = sorted(glob.glob(_CALIBRATION.value or ""))
            if not calibration:
                raise app.UsageError(f"--calibration_images={_CALIBRATION.value!r} matches no file")
        if os.path.lexists(_OUTPUT.value):
            raise app.UsageError(f"--output={_OUTPUT.value!r} exists: --format={fmt} writes a new directory")
    else:
        if _NAME.value in ("", ".", "..") or "/" in _NAME.value or os.sep in _NAME.value:
            raise app.UsageError(f"--name must be one directory name (TF Serving's BASE/NAME/VERSION); "
                                 f"received --name={_NAME.value!r}")
        version = _VERSION.value is not None and pathlib.Path(_OUTPUT.value, _NAME.value, str(_VERSION.value))
        if version and version.exists() and not _OVERWRITE.value:
            raise app.UsageError(f"--version={_VERSION.value} exists at {version}: choose another or pass --overwrite")
    if "://" not in _MODEL.value and not os.path.exists(_MODEL.value) and not is_hub_id(_MODEL.value):
        raise app.UsageError("--model must name an existing .keras file or checkpoint, or a Hugging Face hub id; "
                             f"received --model={_MODEL.value!r}, which does not exist")
    return images, calibration


flags.register_validator("crop_fraction", lambda v: 0.0 < v <= 1.0, "--crop_fraction must be in (0, 1]")
flags.register_validator("top_k", lambda v: v is None or v >= 1, "--top_k must be at least 1")
flags.register_validator("version", lambda v: v is None or v >= 0, "--version must be an integer >= 0")
flags.register_validator("image_size", lambda v: v is None or v >= 1, "--image_size must be a positive integer")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    if not flags.FLAGS["verbosity"].present:  # TensorFlow's INFO lines (signature input renames...) are not the user's
        logging.set_verbosity(logging.WARNING)
    if _INSPECT.value:
        if not os.path.isfile(os.path.join(_INSPECT.value, "saved_model.pb")):
            raise app.UsageError(f"--inspect={_INSPECT.value!r} is not an export: it names a version directory "
                                 "(BASE/NAME/VERSION) holding saved_model.pb")
        from export import saved_model

        print(saved_model.inspect(_INSPECT.value))
        return 0
    image_files, calibration_files = check_flags()
    labels = read_labels(_LABELS.value) if _LABELS.value else None
    missing = backend_problem("export") or choices.missing_message(_FORMAT.value)
    if missing:
        raise SystemExit(missing)  # one line, no traceback: nothing has been read or written
    import keras_vit
    from export import common

    try:
        sized = {"image_size": _IMAGE_SIZE.value} if _IMAGE_SIZE.value is not None else {}
        model = keras_vit.load_model(_MODEL.value, classifier_activation=None, **sized)  # logits from a checkpoint
        request = _request(model, model_labels(model, labels), image_files, calibration_files)
        importlib.import_module(f"export.{_FORMAT.value}").from_command_line(model, request)
    except (common.ToleranceError, common.ModelError) as error:  # the flags were right; the model is not
        raise SystemExit(f"export: {error}") from error
    except keras_vit.checkpoints.WeightsUnavailable as error:  # offline: its three lines say what to do, no usage hint
        raise SystemExit(f"export: {error}") from None
    except ValueError as error:  # what the model or the flags cannot do, named by the check that found it
        raise app.UsageError(str(error)) from error
    return 0


def model_labels(model, labels):
    """The class names: `labels` (`--labels`), else the checkpoint's own (a transformers directory's `id2label`),
    or None.

    Their count is checked against the head here, where the message can name where they came from.
    """
    import keras_vit
    from export import common

    if labels is not None:
        source = f"--labels={_LABELS.value!r} (one class name per line)"
    elif _MODEL.value.endswith(".keras"):
        return None
    else:
        try:
            labels = keras_vit.checkpoints.checkpoint_labels(_MODEL.value)
        except ValueError as error:  # a gap or a key that is no class index, named in config.json
            raise ValueError(f"{error}: correct it, or pass --labels=FILE with one class name per line") from None
        source = f"{os.path.join(_MODEL.value, 'config.json')}'s id2label"
    if labels is not None and common.is_classifier(model) and len(labels) != model.output_shape[-1]:
        fix = "" if _LABELS.value else ": correct it, or pass --labels=FILE with one class name per line"
        raise ValueError(f"{source} names {len(labels)} classes; the model's head has {model.output_shape[-1]}{fix}")
    return labels


def _request(model, labels, image_files, calibration_files):
    """The `common.Request` of the flags, `--images` decoded and scaled as the model takes them."""
    from export import common, preprocessing

    fmt = choices.FORMATS[_FORMAT.value]
    options = {name: flags.FLAGS[name].value for name in fmt.flags}
    metadata = {"source": _MODEL.value}
    if not fmt.images:
        return common.Request(_OUTPUT.value, labels, metadata, crop_fraction=_CROP.value, options=options)
    # Decoded as a request's images are, but without a request's bound on their size: the user's own files.
    steps = preprocessing.Preprocessing.for_model(model, _CROP.value, max_image_pixels=2**31 - 1)
    fields = dataclasses.asdict(steps)
    del fields["max_image_pixels"]  # the model takes no encoded images
    images = preprocessing.read_images(image_files, steps)
    calibration = images if calibration_files is image_files else preprocessing.read_images(calibration_files, steps)
    return common.Request(_OUTPUT.value, labels, {**metadata, **fields}, images, calibration, options=options)


def run(argv):
    """`main`, with a usage error said in one line (not absl's page of every flag before it)."""
    try:
        return main(argv)
    except app.UsageError as error:
        print(f"export: {error}\nSee --helpfull for every flag and its help.", file=sys.stderr)
        return 1


if __name__ == "__main__":
    app.run(run)
