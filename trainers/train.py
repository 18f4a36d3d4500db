"""Trains a ViT: `python -m trainers.train --recipe=NAME --model_dir=DIR [--FIELD=VALUE ...]`.

With no recipe it trains the embedded default (`digits`); with
`--pretrained=CHECKPOINT` it fine-tunes the checkpoint's own model
(`vit_finetune`, `trainers.plan`). Every field of `trainers.recipes.Recipe`
and of the model's `keras_vit.ViTConfig` is a flag with the field's own help
(`--helpfull`); an unset one keeps the recipe's value, or is fitted to the
data and said. Every flag, and a folder's layout and splits, are checked
before TensorFlow is imported: every problem is named at once, one line each,
with nothing written. The run itself is
`trainers.loop.train`: it resumes from `model_dir/checkpoints`, evaluates
every `--eval_every` steps, and writes `model_dir/model.keras`, `model.npz`
(official format) and `metrics.json`.
"""

import os
import pathlib
import sys

# TensorFlow's C++ INFO lines (CUDA stubs, oneDNN, CPU features) say nothing about the run; errors still show.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags, logging  # noqa: E402

from keras_vit import config as vit_config  # noqa: E402
from keras_vit.backends import backend_problem  # noqa: E402
from trainers import jax_distribution, plan, recipes  # noqa: E402
from trainers.strategy import STRATEGIES  # noqa: E402

_RECIPE = flags.DEFINE_enum("recipe", plan.DEFAULT_RECIPE, list(recipes.RECIPES),
                            f"Named recipe to start from (default: {plan.DEFAULT_RECIPE}, or "
                            f"{plan.FINE_TUNING_RECIPE} when --pretrained is set).")
_MODEL_DIR = flags.DEFINE_string("model_dir", None, "Where checkpoints, logs and the final model go.")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "TFDS data directory (default ~/tensorflow_datasets).")
_STRATEGY = flags.DEFINE_enum(
    "strategy", "auto", list(dict.fromkeys([*STRATEGIES, *jax_distribution.STRATEGIES])),
    f"On TensorFlow a tf.distribute strategy ({', '.join(STRATEGIES)}); on JAX a keras.distribution "
    f"({', '.join(jax_distribution.STRATEGIES)}). auto: every device there is.")
_MODEL_AXIS_SIZE = flags.DEFINE_integer(
    "model_axis_size", 0, "--strategy=model_parallel (JAX): the devices that split one copy of the model (default: "
                          "all of them); the batch is split over the rest.", lower_bound=0)
_TPU = flags.DEFINE_string("tpu", "", "TPU name or address for --strategy=tpu.")
_SKIP_BAD_IMAGES = flags.DEFINE_bool(
    "skip_bad_images", False, "Train without the folder images the pre-flight scan finds undecodable.")
_EVAL_EVERY = flags.DEFINE_integer(
    "eval_every", None, "Steps between evaluations of the validation split (default: at every checkpoint; 0: "
                        "none before the end).")
_DETERMINISTIC = flags.DEFINE_bool("deterministic", False, "TF op determinism: the same command, install and "
                                                            "machine give the same weights bit for bit (slower).")


def _define_field_flags():
    """One flag per recipe field and per model (ViTConfig) field, named as the field, with the field's help.

    Unset flags keep the recipe's value. Pairs and per-channel fields are comma-separated (`--image_size=32,48`);
    `--representation_size=0` is none.
    """
    for name, field in {**recipes.FIELDS, **plan.MODEL_FIELDS}.items():
        kind = {"bool": bool, "int": int, "float": float, "tuple": tuple}.get(field.type, field.type)
        define = {bool: flags.DEFINE_bool, int: flags.DEFINE_integer, float: flags.DEFINE_float,
                  tuple: flags.DEFINE_list}.get(kind, flags.DEFINE_string)
        define(name, None, field.metadata["help"])
    flags.DEFINE_string("variant", None, "Model: the encoder of a named variant (B/16, R50+B/16); other model "
                                         "flags then change single fields.")


_define_field_flags()


def field_overrides():
    """The recipe and model fields set on the command line, as values of their fields' types."""
    names = [*recipes.FIELDS, "variant", *plan.MODEL_FIELDS]
    overrides = {name: flags.FLAGS[name].value for name in names if flags.FLAGS[name].value is not None}
    for name, value in overrides.items():
        if isinstance(value, list):  # a comma-separated pair or per-channel values
            number = float if name in vit_config.PER_CHANNEL else int
            try:
                overrides[name] = tuple(number(v) for v in value)
            except ValueError as error:
                raise ValueError(f"--{name} takes comma-separated {number.__name__}s; received {value}") from error
            if name in vit_config.PAIRS and len(value) == 1:  # --image_size=224: a square
                overrides[name] = overrides[name][0]
    if overrides.get("representation_size") == 0:
        overrides["representation_size"] = None
    return overrides


def resolve_recipe(name, overrides):
    """The named recipe with `overrides` applied and validated (`trainers.plan.plan`, without a model_dir)."""
    return plan.plan(name, overrides).recipe


def check_flags(argv):
    """Every flag, alone and against the others, the data and model_dir; returns the `trainers.plan.Plan`.

    Imports no TensorFlow. Raises ValueError naming every flag, value and file at fault, one line each.
    """
    problems = []
    if len(argv) > 1:
        problems.append(f"Unexpected arguments: {argv[1:]}")
    if not _MODEL_DIR.value:
        problems.append("--model_dir is required (where checkpoints and the final model go)")
    try:
        overrides = field_overrides()
    except ValueError as error:
        problems.append(str(error))
        overrides = {}
    if _EVAL_EVERY.value is not None:
        try:
            recipes.check_eval_every(_EVAL_EVERY.value)
        except ValueError as error:
            problems.append(str(error))
    name = plan.recipe_name(_RECIPE.value if flags.FLAGS["recipe"].present else None, overrides)
    try:
        run = plan.plan(name, overrides, _MODEL_DIR.value or None, _EVAL_EVERY.value)
    except plan.Problems as error:
        problems.extend(error.problems)
    if problems:
        raise plan.Problems(problems)
    return run


def refuse(reason):
    """Prints why the command cannot run, one line per problem (not absl's page of flags); returns the exit status."""
    if isinstance(reason, OSError):  # weights out of reach (keras_vit's WeightsUnavailable): its three lines say all
        print(f"trainers.train: {reason}", file=sys.stderr)
        return 1
    problems = getattr(reason, "problems", None) or [str(reason)]
    if len(problems) == 1:
        print(f"trainers.train: {problems[0]}", file=sys.stderr)
    else:
        listed = "".join(f"\n  - {problem}" for problem in problems)
        print(f"trainers.train: {len(problems)} problems, nothing done:{listed}", file=sys.stderr)
    print("See --helpfull for every flag and its help.", file=sys.stderr)
    return 1


def make_strategy(backend, model_config):
    """`(strategy, kind)`: tf.distribute's on TensorFlow, a `jax_distribution.KerasDistribution` on JAX.

    ValueError or RuntimeError naming the flag when the strategy is not the backend's, its devices are missing,
    or the model does not split over them.
    """
    if backend == "jax":
        if _TPU.value:
            raise ValueError(f"--tpu={_TPU.value} names a TPU for tf.distribute (KERAS_BACKEND=tensorflow); on "
                             "Keras' JAX backend a TPU VM's cores are JAX's devices: drop --tpu")
        distribution = jax_distribution.make_distribution(_STRATEGY.value, _MODEL_AXIS_SIZE.value, model_config)
        return distribution, distribution.kind
    if _STRATEGY.value not in STRATEGIES:
        raise ValueError(f"--strategy={_STRATEGY.value} is a keras.distribution of Keras' JAX backend (set "
                         f"KERAS_BACKEND=jax); on TensorFlow use one of {STRATEGIES}")
    if _MODEL_AXIS_SIZE.value:
        raise ValueError(f"--model_axis_size={_MODEL_AXIS_SIZE.value} sizes --strategy=model_parallel on Keras' "
                         "JAX backend (KERAS_BACKEND=jax)")
    from trainers.strategy import make_strategy as make_tensorflow_strategy

    return make_tensorflow_strategy(_STRATEGY.value, _TPU.value)


def main(argv):
    if not flags.FLAGS["verbosity"].present:  # reading a checkpoint's configuration logs at INFO
        logging.set_verbosity(logging.WARNING)
    try:
        run = check_flags(argv)
    except ValueError as error:
        return refuse(error)
    recipe = run.recipe
    for note in run.notes:
        print(f"trainers.train: {note}")
    # Every flag has passed: Keras' backend, and TensorFlow, start here.
    problem = backend_problem("trainers.train")
    if problem:
        print(problem, file=sys.stderr)
        return 1
    import keras
    import tensorflow as tf

    from trainers import loop

    loop.quiet_logs(flags.FLAGS["verbosity"].present)
    if _DETERMINISTIC.value:
        tf.config.experimental.enable_op_determinism()
    try:
        strategy, kind = make_strategy(keras.backend.backend(), recipe.model)
    except (ValueError, RuntimeError) as error:  # a device asked for and missing, a malformed TF_CONFIG
        return refuse(error)
    logging.info("Recipe %s on %s (%d replicas):\n%s", run.name, kind,
                 strategy.num_replicas_in_sync, recipe.to_json())
    try:
        _, metrics = loop.train(recipe, _MODEL_DIR.value, strategy, kind, _DATA_DIR.value, _SKIP_BAD_IMAGES.value,
                                _EVAL_EVERY.value)
    except (loop.InvalidRun, OSError) as error:
        return refuse(error)
    except FloatingPointError as error:
        logging.error("%s", error)
        return 1
    model_dir = pathlib.Path(_MODEL_DIR.value)
    if metrics["validation_examples"]:
        print(f"validation top-1 {metrics['validation_top1']:.4f} ({metrics['validation_examples']} examples held "
              f"out of the training split); best {metrics['best_top1']:.4f} at step "
              f"{metrics['best_step']}, kept in best/")
    tested = "test" if recipe.eval_split else "validation (no test split)"
    print(f"{tested} top-1 {metrics['eval_top1']:.4f}  top-5 {metrics['eval_top5']:.4f}  "
          f"loss {metrics['eval_loss']:.4f}  ({metrics['eval_examples']} examples, step {metrics['step']}, "
          "the final model)")
    print(f"final model: {model_dir / 'model.keras'}\nofficial-format weights: {model_dir / 'model.npz'}")
    if (model_dir / "labels.txt").is_file():
        print(f"class names: {model_dir / 'labels.txt'} (python -m export --labels=...)")
    return 0


if __name__ == "__main__":
    app.run(main)
