"""Few-shot linear evaluation of frozen features, as in the ViT paper.

`python -m trainers.fewshot --model=PATH --dataset=keras_vit_digits|tfds:NAME|folder:PATH
[--train_split=train --eval_split=test --shots=1,5,10,25 --draws=5 --seed=0 --output=FILE.json]`

Dosovitskiy et al. (ICLR 2021), Sec. 4.1 "Metrics": "Few-shot accuracies are
obtained by solving a regularized least-squares regression problem that maps
the (frozen) representation of a subset of training images to {-1, 1}^K
target vectors", in closed form. The paper gives no regulariser; we follow
the authors' public code, big_vision (`evaluators/fewshot_lsr.py`,
`configs/common_fewshot.py`):

- each feature is standardised by the mean and standard deviation of the
  N-shot sample (+1e-5), so one l2 strength suits features of any scale
  (a tanh `pre_logits` in [-1, 1], a LayerNorm output of width 768);
- a constant feature of 100 is appended: the bias it carries is penalised
  1e4 times less than the weights, i.e. almost not at all;
- W = (X^T X + l2 I)^-1 X^T Y with l2 = 2^10, Y one-hot in {-1, 1};
- each draw permutes every class once and takes its first N examples, so a
  draw's 5-shot sample holds its 1-shot one.

big_vision averages 3 seeds; `draws` sets how many here (default 5), and the
range over draws is reported beside the mean.
"""

import dataclasses
import json
import os
import pathlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags, logging  # noqa: E402

from keras_vit.atomic_files import write_text_atomically  # noqa: E402
from keras_vit.model import head_input  # noqa: E402
from keras_vit.preprocessing import input_config  # noqa: E402
from keras_vit.saving import load_model  # noqa: E402
from trainers import data, recipes  # noqa: E402

DEFAULT_SHOTS = (1, 5, 10, 25)
# big_vision's configs/common_fewshot.py.
DEFAULT_L2_REG = 2.0**10
# big_vision's BIAS_CONSTANT: large, so the bias is almost unregularised.
BIAS_FEATURE = 100.0
DATASET_KINDS = ("keras_vit_digits", "tfds:NAME", "folder:PATH")


# --- features


def feature_extractor(model):
    """`model` cut at the vector its head reads (`keras_vit.model.head_input`); `(model, layer name)`.

    A model without a keras_vit head's layers (a headless or foreign model)
    must itself output vectors.
    """
    cut = head_input(model)
    if cut is not None:
        features, name = cut
        return keras.Model(model.inputs, features, name=f"{model.name}_features"), name
    if len(model.output_shape) != 2:
        raise ValueError("The model has no pre_logits / fc_norm / pooling layer and its output is not one vector "
                         f"per image; received output shape {model.output_shape}")
    return model, model.layers[-1].name


def features(model, dataset, batch_size=256, crop_fraction=1.0):
    """Frozen pooled features of every `(image, label)` of `dataset` (unbatched uint8 images).

    Images go through the evaluation pipeline of `trainers.data` (resize to
    the model's image size, optional centre crop, the model's mean/std);
    grayscale images are repeated to RGB for a 3-channel model.

    Returns:
        `(features, labels)`: float32 `(examples, width)` and int64 `(examples,)`.
    """
    extractor, _ = feature_extractor(model)
    config = input_config(model)
    recipe = recipes.Recipe(model=config, eval_crop_fraction=crop_fraction)
    gray_to_rgb = config.channels == 3 and dataset.element_spec[0].shape[-1] == 1

    def prepare(image, label):
        image = tf.image.grayscale_to_rgb(image) if gray_to_rgb else image
        return data.eval_image(image, recipe), label

    batches = dataset.map(prepare, num_parallel_calls=data.AUTOTUNE, deterministic=True)
    outputs, labels = [], []
    for images, batch_labels in batches.batch(batch_size).prefetch(data.AUTOTUNE):
        outputs.append(np.asarray(extractor.predict_on_batch(images), np.float32))
        labels.append(batch_labels.numpy().astype(np.int64))
    if not outputs:
        raise ValueError("The dataset holds no examples")
    return np.concatenate(outputs), np.concatenate(labels)


# --- the closed-form linear fit


@dataclasses.dataclass(frozen=True)
class LinearClassifier:
    """A least-squares classifier on standardised features plus a bias feature."""

    mean: np.ndarray
    scale: np.ndarray
    weights: np.ndarray

    @classmethod
    def fit(cls, x, labels, num_classes, l2_reg):
        """Solves min_W |X W - Y|^2 + l2 |W|^2 for Y one-hot in {-1, 1}, in float64."""
        x = np.asarray(x, np.float64)
        mean, scale = x.mean(axis=0), x.std(axis=0) + 1e-5
        x = _with_bias((x - mean) / scale)
        y = 2.0 * np.eye(num_classes)[labels] - 1.0
        if len(x) >= x.shape[1]:  # the (D, D) system
            weights = np.linalg.solve(x.T @ x + l2_reg * np.eye(x.shape[1]), x.T @ y)
        else:  # the same W through the smaller (N, N) system: X^T (X X^T + l2 I)^-1 Y
            weights = x.T @ np.linalg.solve(x @ x.T + l2_reg * np.eye(len(x)), y)
        return cls(mean, scale, weights)

    def predict(self, x):
        """Class indices of the rows of `x`."""
        return np.argmax(_with_bias((np.asarray(x, np.float64) - self.mean) / self.scale) @ self.weights, axis=1)


def _with_bias(x):
    return np.concatenate([x, np.full((len(x), 1), BIAS_FEATURE)], axis=1)


def check_arguments(shots, draws, l2_reg):
    """Raises ValueError naming the argument for shots that are not distinct ints >= 1, draws < 1 or l2_reg <= 0."""
    shots = list(shots)
    if not shots or not all(isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n >= 1 for n in shots):
        raise ValueError(f"`shots` must be integers >= 1 (examples per class); received shots={shots}")
    if len(set(shots)) != len(shots):
        raise ValueError(f"`shots` must not repeat a value; received shots={shots}")
    if not isinstance(draws, (int, np.integer)) or isinstance(draws, bool) or draws < 1:
        raise ValueError(f"`draws` must be an integer >= 1; received draws={draws!r}")
    if not (isinstance(l2_reg, (int, float)) and np.isfinite(l2_reg) and l2_reg > 0):
        raise ValueError(f"`l2_reg` must be a finite number > 0; received l2_reg={l2_reg!r}")


def check_enough_examples(labels, num_classes, shots):
    """Raises ValueError naming the first class with fewer than max(shots) examples in `labels`."""
    counts = np.bincount(np.asarray(labels, np.int64), minlength=num_classes)
    for label, count in enumerate(counts[:num_classes]):
        if count < max(shots):
            raise ValueError(f"{max(shots)}-shot evaluation needs {max(shots)} training examples of every class; "
                             f"class {label} has {count} (shots={sorted(shots)})")


def sample(labels, num_classes, shots, rng):
    """{N: indices of N examples per class}; the N-shot sample holds every smaller one."""
    permuted = [rng.permutation(np.flatnonzero(labels == label)) for label in range(num_classes)]
    return {n: np.concatenate([indices[:n] for indices in permuted]) for n in shots}


def linear_fewshot(train_features, train_labels, test_features, test_labels, shots=DEFAULT_SHOTS, draws=5,
                   l2_reg=DEFAULT_L2_REG, seed=0, num_classes=None):
    """N-shot accuracy of a closed-form regularised least-squares fit, over several random draws.

    Args:
        train_features, train_labels: `(examples, width)` features and their
            int labels to draw the N-shot samples from.
        test_features, test_labels: where accuracy is measured.
        shots: ints. Examples per class of each sample. Defaults to (1, 5, 10, 25).
        draws: int. Samples drawn per N. Defaults to 5.
        l2_reg: float. The ridge strength on standardised features. Defaults to 2**10 (big_vision's).
        seed: int. Draw d uses numpy's generator seeded (seed, d). Defaults to 0.
        num_classes: int. Defaults to 1 + the largest label of either split.

    Returns:
        `{N: {"mean": float, "min": float, "max": float, "draws": [float, ...]}}`, accuracies in [0, 1].

    Raises:
        ValueError: for bad arguments, or a class with fewer than N training examples.
    """
    check_arguments(shots, draws, l2_reg)
    train_labels, test_labels = np.asarray(train_labels, np.int64), np.asarray(test_labels, np.int64)
    if num_classes is None:
        num_classes = int(max(train_labels.max(), test_labels.max())) + 1
    check_enough_examples(train_labels, num_classes, shots)
    accuracies = {n: [] for n in shots}
    for draw in range(draws):
        for n, indices in sample(train_labels, num_classes, shots, np.random.default_rng([seed, draw])).items():
            classifier = LinearClassifier.fit(train_features[indices], train_labels[indices], num_classes, l2_reg)
            accuracies[n].append(float(np.mean(classifier.predict(test_features) == test_labels)))
    return {n: {"mean": float(np.mean(values)), "min": min(values), "max": max(values), "draws": values}
            for n, values in accuracies.items()}


# --- command line


def _define_flags():
    # Defined only when run as a program: trainers.train defines --seed, --dataset and
    # --data_dir too, and tests import both modules into one process.
    flags.DEFINE_string("model", None, "A .keras file, or a checkpoint keras_vit reads (.npz, .safetensors, "
                                       "Hugging Face directory).")
    flags.DEFINE_string("dataset", "keras_vit_digits", f"One of {', '.join(DATASET_KINDS)}.")
    flags.DEFINE_string("train_split", "train", "Split the N-shot samples are drawn from.")
    flags.DEFINE_string("eval_split", "test", "Split accuracy is measured on.")
    flags.DEFINE_list("shots", [str(n) for n in DEFAULT_SHOTS], "Examples per class, comma-separated.")
    flags.DEFINE_integer("draws", 5, "Random samples per N.")
    flags.DEFINE_integer("seed", 0, "Seed of the samples.")
    flags.DEFINE_float("l2_reg", DEFAULT_L2_REG, "Ridge strength on standardised features.")
    flags.DEFINE_float("crop_fraction", 1.0, "Fraction of the short side kept by the centre crop (1.0: none).")
    flags.DEFINE_integer("batch_size", 256, "Images per forward pass.")
    flags.DEFINE_string("data_dir", None, "TFDS data directory (default ~/tensorflow_datasets).")
    flags.DEFINE_bool("skip_bad_images", False, "Leave out the folder images that cannot be decoded.")
    flags.DEFINE_string("output", None, "Write the results to this JSON file too.")


def parse_shots(values):
    """--shots' comma-separated strings as ints; ValueError naming the flag otherwise."""
    try:
        return [int(value) for value in values]
    except ValueError:
        raise ValueError(f"`shots` must be comma-separated integers >= 1; received shots={','.join(values)}") from None


def check_flags(values):
    """Every check that reads no data and loads no model; raises ValueError naming the flag."""
    if not values.model:
        raise ValueError("--model is required: a .keras file or a checkpoint keras_vit reads")
    if not values.model.startswith(("http://", "https://")) and not os.path.exists(values.model):
        raise ValueError(f"`model` names no file or directory; received model={values.model!r}")
    kind, sep, rest = values.dataset.partition(":")
    if values.dataset != "keras_vit_digits" and not (sep and rest and kind in ("tfds", "folder")):
        raise ValueError(f"`dataset` must be one of {', '.join(DATASET_KINDS)}; received dataset={values.dataset!r}")
    check_arguments(parse_shots(values.shots), values.draws, values.l2_reg)
    if values.seed < 0:
        raise ValueError(f"`seed` must be an integer >= 0; received seed={values.seed}")
    if not 0.0 < values.crop_fraction <= 1.0:
        raise ValueError(f"`crop_fraction` must be in (0, 1]; received crop_fraction={values.crop_fraction}")
    if values.batch_size < 1:
        raise ValueError(f"`batch_size` must be an integer >= 1; received batch_size={values.batch_size}")
    if values.output:
        folder = pathlib.Path(values.output).resolve().parent
        if not folder.is_dir() or pathlib.Path(values.output).is_dir():
            raise ValueError(f"`output` must be a file in an existing directory; received output={values.output!r}")


def open_splits(values):
    """The model and both splits, checked against each other and the shots before any feature is computed."""
    model = load_model(values.model)
    train = data.load(values.dataset, values.train_split, values.data_dir, 0, values.skip_bad_images)
    test = data.load(values.dataset, values.eval_split, values.data_dir, 0, values.skip_bad_images)
    data.check_disjoint(values.dataset, values.train_split, train, values.eval_split, test)
    channels = model.input_shape[-1]
    if train.channels not in (channels, 1):
        raise ValueError(f"The model takes {channels}-channel images; dataset={values.dataset!r} has {train.channels}")
    labels = np.concatenate(list(train.dataset.map(lambda image, label: label).batch(4096).as_numpy_iterator()))
    check_enough_examples(labels, train.num_classes, parse_shots(values.shots))
    return model, train, test


def evaluate(values):
    """Features of both splits, then the few-shot fits; the report as a JSON-ready dict."""
    model, train, test = open_splits(values)
    shots = parse_shots(values.shots)
    train_x, train_y = features(model, train.dataset, values.batch_size, values.crop_fraction)
    test_x, test_y = features(model, test.dataset, values.batch_size, values.crop_fraction)
    results = linear_fewshot(train_x, train_y, test_x, test_y, shots, values.draws, values.l2_reg, values.seed,
                             train.num_classes)
    return {"model": values.model, "dataset": values.dataset, "train_split": values.train_split,
            "eval_split": values.eval_split, "feature_layer": feature_extractor(model)[1],
            "feature_width": int(train_x.shape[1]), "num_classes": train.num_classes,
            "train_examples": len(train_y), "eval_examples": len(test_y), "draws": values.draws,
            "seed": values.seed, "l2_reg": values.l2_reg, "crop_fraction": values.crop_fraction,
            "results": {str(n): result for n, result in results.items()}}


def format_table(report):
    """The N-shot accuracies as a text table (percent: mean, then min and max over the draws)."""
    lines = [f"Few-shot linear evaluation of {report['model']} ({report['feature_layer']}, "
             f"width {report['feature_width']}) on {report['dataset']}: {report['train_split']} -> "
             f"{report['eval_split']} ({report['eval_examples']} images, {report['num_classes']} classes), "
             f"{report['draws']} draws, seed {report['seed']}, l2_reg {report['l2_reg']:g}",
             f"{'shots':>5}  {'mean':>7}  {'min':>7}  {'max':>7}"]
    for n, result in report["results"].items():
        lines.append(f"{n:>5}  " + "  ".join(f"{100 * result[key]:6.2f}%" for key in ("mean", "min", "max")))
    return "\n".join(lines)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    values = flags.FLAGS
    try:
        check_flags(values)
        if not values["verbosity"].present:
            logging.set_verbosity(logging.WARNING)
        report = evaluate(values)
    except ValueError as error:
        raise app.UsageError(str(error)) from error
    print(format_table(report))
    if values.output:
        write_text_atomically(pathlib.Path(values.output), json.dumps(report, indent=2) + "\n")
        print(f"results: {values.output}")
    return 0


if __name__ == "__main__":
    _define_flags()
    app.run(main)
