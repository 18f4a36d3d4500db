"""What a command line asks the trainer for: the recipe, its model, and the recipe's defaults fitted to the data.

`plan` runs before TensorFlow starts and reports every problem it finds at
once (`Problems`), one line each. It applies three rules:

- With `--pretrained=CHECKPOINT` and no `--recipe`, the run fine-tunes
  (`vit_finetune`), and the model is the checkpoint's own: its architecture,
  numerics and image size, the recipe's training fields, then the flags.
- A recipe *default* that cannot fit the data or the run (a batch larger
  than a folder's training images, no test split, a warm-up as long as the
  run) is adapted, and each adaptation is said in one line (`notes`).
- A value the user *set* that cannot work is refused, naming it.
"""

import dataclasses
import os

from keras_vit import config as vit_config
from trainers import folders, recipes

# The recipe a command line without --recipe runs: from scratch, or fine-tuning a checkpoint.
DEFAULT_RECIPE = "digits"
FINE_TUNING_RECIPE = "vit_finetune"
# The fields a checkpoint decides when fine-tuning from it (the others are the recipe's and the dataset's).
_CHECKPOINT_ROLES = (vit_config.ARCHITECTURE, vit_config.CONVENTION, vit_config.RESOLUTION)
# The model's fields a run sets (its classes and channels are the dataset's).
MODEL_FIELDS = {name: field for name, field in vit_config.FIELDS.items() if name not in vit_config.DATA_FIELDS}


class Problems(ValueError):
    """Every problem of a command line, one message each."""

    def __init__(self, problems):
        super().__init__("\n".join(problems))
        self.problems = list(problems)


@dataclasses.dataclass
class Plan:
    """A checked command line: the recipe to run, its name, and what was adapted."""

    recipe: recipes.Recipe
    name: str
    # One line for each recipe default adapted to the data.
    notes: list


def recipe_name(named, overrides):
    """The recipe the command line runs: --recipe when given, else fine-tuning when --pretrained is set."""
    return named or (FINE_TUNING_RECIPE if overrides.get("pretrained") else DEFAULT_RECIPE)


def plan(name, overrides, model_dir=None, eval_every=None):
    """The recipe `name` with `overrides` (the flags set), checked against its data and `model_dir`; a `Plan`.

    Raises Problems listing everything wrong at once; reads only.
    """
    problems, notes = [], []
    recipe = _with_overrides(recipes.RECIPES[name], overrides, problems)
    recipe = _checkpoint_model(recipe, overrides, problems)
    if recipe.warmup_steps >= recipe.train_steps > 0 and recipe.warmup_steps:
        if "warmup_steps" in overrides:
            problems.append(f"`warmup_steps` must be fewer than the {recipe.train_steps} train_steps, or the learning "
                            f"rate never reaches its peak; received warmup_steps={recipe.warmup_steps}")
        else:  # the recipe's share of its own run
            default = recipes.RECIPES[name]
            warmup = round(recipe.train_steps * default.warmup_steps / default.train_steps)
            notes.append(f"warmup_steps={warmup}: the recipe's {recipe.warmup_steps} is not fewer than "
                         f"train_steps={recipe.train_steps} (the recipe's share of its run)")
            recipe = recipe.replace(warmup_steps=warmup)
    found = recipes.problems(recipe)
    problems.extend(found)
    if isinstance(recipe.dataset, str) and recipe.dataset.startswith("folder:"):
        recipe = _fit_folder(recipe, overrides, problems, notes)
    if name == DEFAULT_RECIPE and recipe.dataset != recipes.RECIPES[name].dataset and "image_size" not in overrides:
        notes.append(f"image_size={recipe.model.image_size[0]}x{recipe.model.image_size[1]} (the digits recipe's): "
                     f"{recipe.dataset}'s images are resized to it; set --image_size to train at another size")
    if eval_every is not None and not found:
        _collect(problems, recipes.check_eval_every, eval_every, recipe)
    if model_dir is not None:
        _collect(problems, recipes.check_model_dir, model_dir, recipe)
    if problems:
        raise Problems(problems)
    return Plan(recipe, name, notes)


def _collect(problems, check, *args, **kwargs):
    """`check(*args, **kwargs)`, or None with its ValueError's message added to `problems`."""
    try:
        return check(*args, **kwargs)
    except ValueError as error:
        problems.append(str(error))


def _with_overrides(recipe, overrides, problems):
    """`recipe` with `overrides`; an unknown field, a model that cannot be built, an inert flag named in `problems`."""
    known = {*recipes.FIELDS, "variant", *MODEL_FIELDS}
    unknown = sorted(set(overrides) - known)
    if unknown:
        problems.append(f"Unknown recipe fields {unknown}; known: {sorted(known)}")
    given = {field: value for field, value in overrides.items() if field not in unknown}
    alone = vit_config.field_problems({f: v for f, v in given.items() if f in MODEL_FIELDS}, recipe.model.channels)
    if alone:  # each bad field named; together they would stop at the first
        problems.extend(alone)
        given = {field: value for field, value in given.items() if field in recipes.FIELDS}
    try:
        together = recipe.replace(**given)
    except ValueError as error:  # the model's fields, judged together by ViTConfig
        problems.append(str(error))
        given = {field: value for field, value in given.items() if field in recipes.FIELDS}
        together = recipe.replace(**given)  # the recipe's own fields, which the recipe's checks judge
    inert = recipes.inert_fields(together)
    problems.extend(f"--{field}={given[field]!r} would change nothing with {inert[field]}. Drop it, or set what it "
                    "needs" for field in sorted(set(given) & set(inert)))
    return together


def _checkpoint_model(recipe, overrides, problems):
    """`recipe` whose model is the --pretrained checkpoint's own (its architecture, numerics and image size).

    The pre_logits layer is the recipe's (none: the paper's fine-tuning drops it), the training fields the
    recipe's, and every model flag set wins. Named weights keep the recipe's variant (or --variant's) at their
    own image size; URLs and .weights.h5 files keep the recipe's model.
    """
    if not overrides.get("pretrained"):  # a recipe's own weights go with the recipe's model
        return recipe
    from keras_vit.checkpoints import config_from_checkpoint, resolve_weights

    try:
        weights = resolve_weights(recipe.pretrained)
    except ValueError:  # a pretrained name: its variant's model, at the name's image size
        return _named_weights_size(recipe, overrides)
    if weights.kind == "hub" or weights.kind in ("file", "directory") and weights.local:
        if weights.kind != "hub" and not os.path.exists(weights.location):
            return recipe  # recipes.problems names a missing file
    else:
        return recipe
    try:
        checkpoint = config_from_checkpoint(weights.location)
    except (ValueError, OSError) as error:
        if isinstance(error, OSError):  # a hub id out of reach: its three lines, alone (trainers.train.refuse)
            raise
        problems.append(f"`pretrained` cannot be read: {error}")
        return recipe
    fields = {name: getattr(checkpoint if field.metadata["role"] in _CHECKPOINT_ROLES else recipe.model, name)
              for name, field in vit_config.FIELDS.items()}
    fields["representation_size"] = recipe.model.representation_size
    model_flags = {name: value for name, value in overrides.items() if name in vit_config.FIELDS or name == "variant"}
    try:
        return dataclasses.replace(recipe, model=vit_config.ViTConfig.from_dict(fields)).replace(**model_flags)
    except ValueError as error:
        problems.append(f"The model flags do not fit {recipe.pretrained}: {error}")
        return recipe


def _named_weights_size(recipe, overrides):
    """`recipe` at the image size its named weights were trained at, unless --image_size says otherwise."""
    from keras_vit.checkpoints import resolve_weights
    from keras_vit.variants import variant_name

    try:
        entry = resolve_weights(recipe.pretrained, variant_name(recipe.model)).entry
    except ValueError:
        return recipe  # recipes.problems names the variant's weights
    if "image_size" in overrides or entry is None:
        return recipe
    return recipe.replace(image_size=entry.image_size)


def _fit_folder(recipe, overrides, problems, notes):
    """Checks a folder dataset's layout and splits; adapts the recipe's default splits and batch to it."""
    root = recipe.dataset.partition(":")[2]
    problem = folders.layout_problem(root)
    if problem:
        problems.append(problem)
        return recipe
    available = folders.splits(root)
    train_split = folders.parse_split(recipe.train_split)[0] if _parses(recipe.train_split, problems) else None
    if recipe.eval_split and "eval_split" not in overrides and recipe.eval_split not in available:
        eval_split = next((s for s in folders.TEST_SPLITS if s in available and s != train_split), "")
        notes.append(f"eval_split={eval_split!r}: {root} has no {recipe.eval_split!r} split; "
                     + (f"the final model is tested on {eval_split!r}" if eval_split else
                        "the final report is the validation split held out of training (a test split, "
                        f"{root}/test/LABEL/IMAGE, gives an unbiased figure)"))
        recipe = recipe.replace(eval_split=eval_split)
    listed = {}
    for field in ("train_split", "eval_split"):
        if getattr(recipe, field):
            listed[field] = _collect(problems, folders.list_split, root, getattr(recipe, field))
    train = listed.get("train_split")
    if train is None:
        return recipe
    empty = [name for name, count in train.counts().items() if not count]
    if empty:
        problems.append(f"The training split {recipe.train_split!r} of {root} has no image of class(es) {empty} "
                        "(they are in another split): the model would never learn them")
    held = folders.hold_out(train, recipe.validation_fraction, recipe.seed)[1] if recipe.validation_fraction else ()
    if recipe.validation_fraction and not held:
        problems.append(f"validation_fraction={recipe.validation_fraction} holds out none of {root}'s training "
                        "images: no class has two; add images, or set --validation_fraction=0 with a test split")
    count = len(train) - len(held)
    if recipe.batch_size > count > 0:
        if "batch_size" in overrides:
            problems.append(f"`batch_size` must be <= the {count} training images of {root} split "
                            f"{recipe.train_split!r}" + (f" ({len(held)} held out for validation)" if held else "")
                            + f"; received batch_size={recipe.batch_size}")
        else:
            batch = 1 << (count.bit_length() - 1)  # the largest power of two that fits
            notes.append(f"batch_size={batch}: the recipe's {recipe.batch_size} is more than the {count} training "
                         f"images of {root}")
            recipe = recipe.replace(batch_size=batch)
    return recipe


def _parses(split, problems):
    return _collect(problems, folders.parse_split, split) is not None
