"""Trains a ViT: `python -m trainers.train --recipe=NAME --model_dir=DIR [--FIELD=VALUE ...]`.

With no recipe it trains the embedded default (`digits`). Every field of
`trainers.recipes.Recipe` and of the model's `keras_vit.ViTConfig` is a flag
with the field's own help (`--helpfull`); an unset one keeps the recipe's
value. Every flag is parsed and checked before TensorFlow is imported: a bad
one is refused at once, in one line, with nothing written. The run itself is
`trainers.loop.train`: it resumes from `model_dir/checkpoints`, evaluates
every `--eval_every` steps, and writes `model_dir/model.keras`, `model.npz`
(official format) and `metrics.json`.
"""

import pathlib
import sys

from absl import app, flags, logging

from keras_vit import config as vit_config
from keras_vit.backends import tensorflow_backend_problem
from trainers import recipes
from trainers.strategy import STRATEGIES

_RECIPE = flags.DEFINE_enum("recipe", "digits", list(recipes.RECIPES), "Named recipe to start from.")
_MODEL_DIR = flags.DEFINE_string("model_dir", None, "Where checkpoints, logs and the final model go.")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "TFDS data directory (default ~/tensorflow_datasets).")
_STRATEGY = flags.DEFINE_enum("strategy", "auto", list(STRATEGIES), "tf.distribute strategy.")
_TPU = flags.DEFINE_string("tpu", "", "TPU name or address for --strategy=tpu.")
_SKIP_BAD_IMAGES = flags.DEFINE_bool(
    "skip_bad_images", False, "Train without the folder images the pre-flight scan finds undecodable.")
_EVAL_EVERY = flags.DEFINE_integer(
    "eval_every", None, "Steps between evaluations of the validation split (default: at every checkpoint; 0: "
                        "none before the end).")
_DETERMINISTIC = flags.DEFINE_bool("deterministic", False, "Enable TF op determinism (reproducible on CPU).")


# The model's fields a run sets (its classes and channels are the dataset's).
MODEL_FIELDS = {name: field for name, field in vit_config.FIELDS.items() if name not in vit_config.DATA_FIELDS}


def _define_field_flags():
    """One flag per recipe field and per model (ViTConfig) field, named as the field, with the field's help.

    Unset flags keep the recipe's value. Pairs and per-channel fields are comma-separated (`--image_size=32,48`);
    `--representation_size=0` is none.
    """
    for name, field in {**recipes.FIELDS, **MODEL_FIELDS}.items():
        kind = {"bool": bool, "int": int, "float": float, "tuple": tuple}.get(field.type, field.type)
        define = {bool: flags.DEFINE_bool, int: flags.DEFINE_integer, float: flags.DEFINE_float,
                  tuple: flags.DEFINE_list}.get(kind, flags.DEFINE_string)
        define(name, None, field.metadata["help"])
    flags.DEFINE_string("variant", None, "Model: the encoder of a named variant (B/16, R50+B/16); other model "
                                         "flags then change single fields.")


_define_field_flags()


def field_overrides():
    """The recipe and model fields set on the command line, as values of their fields' types."""
    names = [*recipes.FIELDS, "variant", *MODEL_FIELDS]
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
    """The named recipe with `overrides` applied and validated."""
    known = {*recipes.FIELDS, "variant", *MODEL_FIELDS}
    unknown = set(overrides) - known
    if unknown:
        raise ValueError(f"Unknown recipe fields {sorted(unknown)}; known: {sorted(known)}")
    recipe = recipes.validate(recipes.RECIPES[name].replace(**overrides))
    inert = recipes.inert_fields(recipe)
    given = sorted(set(overrides) & set(inert))
    if given:
        raise ValueError("; ".join(f"--{field}={overrides[field]!r} would change nothing with {inert[field]}"
                                   for field in given) + ". Drop it, or set what it needs")
    return recipe


def check_flags(argv):
    """Every flag, alone and against the others and model_dir; returns the recipe. Imports no TensorFlow.

    Raises ValueError naming the flag, the value and what is allowed.
    """
    if len(argv) > 1:
        raise ValueError(f"Unexpected arguments: {argv[1:]}")
    if not _MODEL_DIR.value:
        raise ValueError("--model_dir is required (where checkpoints and the final model go)")
    recipe = resolve_recipe(_RECIPE.value, field_overrides())
    if _EVAL_EVERY.value is not None:
        recipes.check_eval_every(_EVAL_EVERY.value, recipe)
    recipes.check_model_dir(_MODEL_DIR.value, recipe)
    return recipe


def refuse(reason):
    """Prints why the command cannot run, in one line (not absl's page of flags); returns the exit status."""
    print(f"trainers.train: {reason}\nSee --helpfull for every flag and its help.", file=sys.stderr)
    return 1


def main(argv):
    try:
        recipe = check_flags(argv)
    except ValueError as error:
        return refuse(error)
    # Every flag has passed: TensorFlow starts here.
    problem = tensorflow_backend_problem("trainers.train")
    if problem:
        print(problem, file=sys.stderr)
        return 1
    import tensorflow as tf

    from trainers import loop
    from trainers.strategy import make_strategy

    loop.quiet_logs(flags.FLAGS["verbosity"].present)
    if _DETERMINISTIC.value:
        tf.config.experimental.enable_op_determinism()
    try:
        strategy, kind = make_strategy(_STRATEGY.value, _TPU.value)
    except (ValueError, RuntimeError) as error:  # a device asked for and missing, a malformed TF_CONFIG
        return refuse(error)
    logging.info("Recipe %s on %s (%d replicas):\n%s", _RECIPE.value, kind,
                 strategy.num_replicas_in_sync, recipe.to_json())
    try:
        _, metrics = loop.train(recipe, _MODEL_DIR.value, strategy, kind, _DATA_DIR.value, _SKIP_BAD_IMAGES.value,
                                _EVAL_EVERY.value)
    except loop.InvalidRun as error:
        return refuse(error)
    except FloatingPointError as error:
        logging.error("%s", error)
        return 1
    model_dir = pathlib.Path(_MODEL_DIR.value)
    if metrics["validation_examples"]:
        print(f"validation top-1 {metrics['validation_top1']:.4f} ({metrics['validation_examples']} examples held "
              f"out of the training split); best {metrics['best_top1']:.4f} at step "
              f"{metrics['best_step']}, kept in best/")
    print(f"test top-1 {metrics['eval_top1']:.4f}  top-5 {metrics['eval_top5']:.4f}  "
          f"loss {metrics['eval_loss']:.4f}  ({metrics['eval_examples']} examples, step {metrics['step']}, "
          "the final model)")
    print(f"final model: {model_dir / 'model.keras'}\nofficial-format weights: {model_dir / 'model.npz'}")
    return 0


if __name__ == "__main__":
    app.run(main)
