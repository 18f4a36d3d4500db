"""Named training recipes: every hyperparameter of a run, in one frozen dataclass.

Each recipe names its source, the result it should reach and the command that
runs it. `python -m trainers.train --recipe=NAME --FIELD=VALUE` overrides any
field, the model's architecture fields (`keras_vit.ViTConfig`) included;
an unknown field is an error. The resolved recipe is saved as
`recipe.json` beside the checkpoints.
"""

import dataclasses
import json
import math
import os
import pathlib

from keras_vit import config as vit_config
from keras_vit.config import ViTConfig
from keras_vit.variants import decode_variant, variant_fields, variant_name

# Learning-rate decays after the linear warm-up (trainers.optimization.WarmupSchedule).
DECAYS = ("cosine", "linear", "constant")
# Numeric domains: (low, high, low_open, high_open); None is unbounded.
_AT_LEAST_0 = (0, None, False, False)
_AT_LEAST_1 = (1, None, False, False)
_POSITIVE = (0, None, True, False)
_FRACTION = (0, 1, False, False)  # [0, 1]
_BELOW_1 = (0, 1, False, True)  # [0, 1)


def _field(default, help_text, *, choices=None, bounds=None, rgb_only=False):
    """A Recipe field: its default, its help (the trainer's flag help) and its domain (`validate`).

    rgb_only: the augmentation it turns on takes RGB images only (Model Garden's ops).
    """
    return dataclasses.field(default=default, metadata={"help": help_text, "choices": choices, "bounds": bounds,
                                                        "rgb_only": rgb_only})


@dataclasses.dataclass(frozen=True)
class Recipe:
    """Everything a training run needs besides where it runs."""

    # --- what it is
    description: str = _field("", "One line: what the recipe trains, its source and its expected result.")

    # --- model
    # Every keras_vit.ViTConfig field is also a flag (--hidden_size=64); --variant=B/16 sets the encoder of a
    # named variant.
    model: ViTConfig = _field(ViTConfig(), "The architecture; its classes and channels are the dataset's.")
    pretrained: str = _field("", "Weights to start from: a pretrained name of the model's variant (e.g. "
                             "imagenet21k), a checkpoint (official .npz, timm / Hugging Face .safetensors or "
                             "directory), a .weights.h5 file, or '' (scratch).")

    # --- task
    task: str = _field("classification", "'classification' (the labels), or 'mpp': masked patch prediction, "
                       "self-supervised (labels unused; keras_vit.mpp), whose model.npz is the headless ViT that "
                       "--pretrained fine-tunes.", choices=("classification", "mpp"))
    distillation: str = _field("none", "DeiT distillation from a frozen teacher: 'none', 'hard' (its argmax) or "
                               "'soft' (KL to its output at distillation_temperature), weighted distillation_alpha "
                               "against the labels' (1 - alpha).", choices=("none", "hard", "soft"))
    teacher: str = _field("", "The teacher: a .keras file, a SavedModel directory or keras.applications.NAME (a "
                          "ConvNeXt, EfficientNet or MobileNetV3, with ImageNet weights Keras downloads); a "
                          "classifier of the dataset's classes that takes RGB pixels in [0, 255] (a keras_vit "
                          "model takes its own inputs).")
    teacher_signature: str = _field("serving_default", "A SavedModel teacher's signature.")
    teacher_outputs: str = _field("auto", "Whether the teacher returns 'logits' or 'probabilities' ('auto': a "
                                  "Keras model's last activation, a signature's output name).",
                                  choices=("auto", "logits", "probabilities"))
    distillation_alpha: float = _field(0.5, "Weight of the distillation loss against the labels' (1 - alpha).",
                                       bounds=_FRACTION)
    distillation_temperature: float = _field(1.0, "Temperature of soft distillation.", bounds=_POSITIVE)

    # --- data
    dataset: str = _field("keras_vit_digits", "'keras_vit_digits' (embedded), 'tfds:NAME', 'folder:PATH' or "
                          "'tfrecord:GLOB' (with {split} in the glob).")
    train_split: str = _field("train", "Split to train on.")
    eval_split: str = _field("test", "Split to report: evaluated once, by the final model; '' (a dataset without "
                             "a test split) reports the validation split held out of training instead.")
    validation_fraction: float = _field(
        0.01, "Fraction of train_split held out (seeded by `seed`) for the evaluations during the run and the "
        "choice of best/; 0 holds none out, and then the run evaluates only at the end (big_vision's minival "
        "is 1% of ImageNet's train).", bounds=(0, 0.5, False, True))
    num_classes: int = _field(0, "Classes; 0 reads them from the dataset (TFDS, folder).", bounds=_AT_LEAST_0)
    shuffle_buffer: int = _field(10_000, "Examples in the shuffle buffer.", bounds=_AT_LEAST_1)
    train_crop: str = _field("inception", "Training crop: 'inception' (random area 5-100%, aspect 3/4-4/3) or "
                             "'resize'.", choices=("inception", "resize"))
    flip: bool = _field(True, "Random horizontal flips in training.")
    eval_crop_fraction: float = _field(0.875, "Fraction of the short side kept by the evaluation centre crop "
                                       "(1.0: none).", bounds=(0, 1, True, False))
    random_shift: int = _field(0, "Random translation by up to this many pixels (after resizing); 0 for none.",
                               bounds=_AT_LEAST_0)
    randaugment_layers: int = _field(0, "RandAugment layers (0: off).", bounds=_AT_LEAST_0, rgb_only=True)
    randaugment_magnitude: float = _field(9.0, "RandAugment magnitude.", bounds=_AT_LEAST_0)
    randaugment_magnitude_std: float = _field(0.0, "Per-image standard deviation of the RandAugment magnitude "
                                              "(only 0 runs with Model Garden 2.20).", bounds=_AT_LEAST_0)
    mixup_alpha: float = _field(0.0, "Mixup alpha (0: off).", bounds=_AT_LEAST_0, rgb_only=True)
    cutmix_alpha: float = _field(0.0, "CutMix alpha (0: off).", bounds=_AT_LEAST_0, rgb_only=True)
    label_smoothing: float = _field(0.0, "Label smoothing of the training targets.", bounds=_BELOW_1)
    random_erasing: float = _field(0.0, "Probability of random erasing (0: off).", bounds=_FRACTION,
                                   rgb_only=True)

    # --- optimisation
    optimizer: str = _field("adamw", "'adam', 'adamw' or 'sgd'.", choices=("adam", "adamw", "sgd"))
    learning_rate: float = _field(1e-3, "Peak learning rate; multiplied by batch_size / lr_batch_reference when "
                                  "that is set.", bounds=_POSITIVE)
    lr_batch_reference: int = _field(0, "The batch size learning_rate is stated for (0: learning_rate as is).",
                                     bounds=_AT_LEAST_0)
    beta_1: float = _field(0.9, "Adam's beta_1.", bounds=_BELOW_1)
    beta_2: float = _field(0.999, "Adam's beta_2.", bounds=_BELOW_1)
    momentum: float = _field(0.9, "SGD momentum.", bounds=_BELOW_1)
    weight_decay: float = _field(0.0, "Decoupled weight decay, applied to kernels only (not biases, norms, "
                                 "tokens, positions).", bounds=_AT_LEAST_0)
    schedule: str = _field("cosine", "Learning-rate decay after a linear warm-up: 'cosine', 'linear' or "
                           "'constant'.", choices=DECAYS)
    warmup_steps: int = _field(0, "Steps of linear learning-rate warm-up.", bounds=_AT_LEAST_0)
    grad_clip_norm: float = _field(0.0, "Global-norm gradient clipping (0: off).", bounds=_AT_LEAST_0)
    layer_decay: float = _field(1.0, "Layer-wise learning-rate decay (BEiT, MAE, timm): block i of L trains at "
                                "layer_decay^(L - i) of the rate, the embeddings and prefix tokens at "
                                "layer_decay^(L + 1), the head at the full rate (1: off).", bounds=(0, 1, True, False))
    ema_decay: float = _field(0.0, "Decay of an exponential moving average of the weights, per optimiser step "
                              "(timm's ModelEmaV3; e.g. 0.9998): evaluations, best/, model.keras, model.npz and "
                              "exports take the average (0: off).", bounds=_BELOW_1)
    ema_warmup: bool = _field(True, "The EMA's warm-up: after update n its decay is min(ema_decay, "
                              "1 - n^(-2/3)), so the average forgets its random start (timm's --model-ema-warmup).")
    batch_size: int = _field(512, "Global batch size of one optimiser step (split over replicas, then into "
                             "grad_accumulation_steps micro-batches).", bounds=_AT_LEAST_1)
    grad_accumulation_steps: int = _field(1, "Micro-batches per optimiser step: each of batch_size / K images, "
                                          "their gradients averaged into one step, the update of the whole batch "
                                          "in the memory of a micro-batch. Steps count optimiser steps.",
                                          bounds=_AT_LEAST_1)
    train_steps: int = _field(1000, "Length of training in steps.", bounds=_AT_LEAST_1)

    # --- running
    steps_per_execution: int = _field(8, "Steps per tf.function call (fewer host round trips).",
                                      bounds=_AT_LEAST_1)
    jit_compile: str = _field("auto", "Compile the step with XLA: 'auto' (on TPU and GPU, off on the CPU, as "
                              "Keras' own 'auto'), 'true' or 'false'.", choices=("auto", "true", "false"))
    mixed_precision: str = _field("auto", "'auto' (bfloat16 on TPU/GPU, float32 on CPU), 'bfloat16' or "
                                  "'float32'.", choices=("auto", "bfloat16", "float32"))
    checkpoint_every: int = _field(500, "Steps between checkpoints (the most a crash can lose).",
                                   bounds=_AT_LEAST_1)
    seed: int = _field(0, "Seed of weights, data order and augmentation.",
                       bounds=(0, 2**32 - 1, False, False))  # what keras.utils.set_random_seed takes

    def replace(self, **changes):
        """A copy with `changes`: recipe fields, the model's `ViTConfig` fields, or `variant` (its encoder)."""
        model_changes = variant_fields(changes.pop("variant")) if "variant" in changes else {}
        model_changes.update({name: changes.pop(name) for name in list(changes) if name in vit_config.FIELDS})
        return dataclasses.replace(self, model=self.model.replace(**model_changes), **changes)

    def to_dict(self):
        return {**dataclasses.asdict(self), "model": self.model.to_dict()}

    def to_json(self):
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


FIELDS = {f.name: f for f in dataclasses.fields(Recipe) if f.name != "model"}

# DeiT from scratch; `deit_distilled` is the same recipe with a teacher.
_DEIT = Recipe(
    description=(
        "DeiT-B/16 from scratch on ImageNet-1k (Touvron et al. 2021, Table 9; Model Garden "
        "deit_imagenet_pretrain): AdamW lr 5e-4 x batch/512, weight decay 0.05, cosine with 5 "
        "warm-up epochs, RandAugment m9 (mstd 0.5 in the paper; 0 here: Model Garden 2.20 cannot "
        "vary it on uint8 images), Mixup 0.8, CutMix 1.0, label smoothing 0.1, "
        "random erasing 0.25, stochastic depth 0.1, 300 epochs at batch 1024. Expected: 81.8%."
    ),
    model=decode_variant("B/16").replace(drop_path_rate=0.1), dataset="tfds:imagenet2012",
    train_split="train", eval_split="validation", train_crop="inception", flip=True,
    randaugment_layers=2, randaugment_magnitude=9.0, randaugment_magnitude_std=0.0,
    mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, random_erasing=0.25,
    optimizer="adamw", learning_rate=5e-4, lr_batch_reference=512, weight_decay=0.05,
    schedule="cosine", warmup_steps=6_255, batch_size=1024, train_steps=375_300,
    checkpoint_every=2000,
)


RECIPES = {
    "digits": Recipe(
        description=(
            "The embedded default: a 4-layer, 64-wide ViT with 2x2 patches trained from scratch "
            "on scikit-learn's 8x8 digits (TFDS builder keras_vit_digits). Expected: about 97% test "
            "top-1 (the README's figure over seeds) in minutes on 2 CPU cores. "
            "`python -m trainers.train --model_dir=/tmp/digits`"
        ),
        model=ViTConfig(patch_size=2, hidden_size=64, mlp_dim=128, num_heads=4, num_layers=4, image_size=8,
                        classifier="gap", drop_path_rate=0.1),
        dataset="keras_vit_digits", validation_fraction=0.1, train_crop="resize", flip=False,
        eval_crop_fraction=1.0, random_shift=1, label_smoothing=0.1,
        optimizer="adamw", learning_rate=2e-3, weight_decay=0.05, schedule="cosine",
        warmup_steps=100, batch_size=64, train_steps=4000, steps_per_execution=25,
        checkpoint_every=500, mixed_precision="float32",
    ),
    "vit_i21k_pretrain": Recipe(
        description=(
            "The paper's ImageNet-21k pre-training of ViT-B/16 (Dosovitskiy et al. 2021, Sec. 4.1 "
            "and Table 3): Adam 0.9/0.999, batch 4096, lr 1e-3, 10k warm-up steps, linear decay, "
            "weight decay 0.03, dropout 0.1, 90 epochs of ImageNet-21k (~300k steps), 224 px, "
            "pre-logits. ImageNet-21k is not in TFDS: pass it with --dataset=folder:PATH or "
            "tfrecord:GLOB (and --num_classes); the default, tfds:imagenet2012, makes these steps ~960 "
            "epochs of ImageNet-1k, not the paper's run. Expected with ImageNet-21k: the released "
            "imagenet21k/ViT-B_16.npz quality (84.2% top-1 after the fine-tune recipe). On a TPU "
            "pod: `--strategy=tpu --tpu=NAME`."
        ),
        model=decode_variant("B/16").replace(representation_size=768, dropout_rate=0.1),
        dataset="tfds:imagenet2012", num_classes=0, train_split="train", eval_split="validation",
        optimizer="adamw", learning_rate=1e-3, beta_1=0.9, beta_2=0.999, weight_decay=0.03,
        schedule="linear", warmup_steps=10_000, grad_clip_norm=1.0, batch_size=4096,
        train_steps=300_000, checkpoint_every=2000,
    ),
    "vit_finetune": Recipe(
        description=(
            "The paper's fine-tuning (Sec. 4.1, Appendix B.1.1, vit_jax/configs/common.py): SGD "
            "momentum 0.9, batch 512, cosine to 0 after 500 warm-up steps, no weight decay, "
            "gradient clipping at global norm 1, 384 px, head restarted at zero and position "
            "embeddings resized by the checkpoint loader; 20k steps on ImageNet from ViT-B/16 "
            "imagenet21k; no layer decay and no EMA (the paper has neither: mae_finetune has decay). Expected: "
            "~84% top-1 (the released imagenet21k+imagenet2012 file)."
        ),
        model=decode_variant("B/16").replace(image_size=384), pretrained="imagenet21k",
        dataset="tfds:imagenet2012", train_split="train", eval_split="validation",
        optimizer="sgd", learning_rate=0.03, momentum=0.9, weight_decay=0.0, schedule="cosine",
        warmup_steps=500, grad_clip_norm=1.0, batch_size=512, train_steps=20_000,
    ),
    "mae_finetune": dataclasses.replace(
        _DEIT,
        description=(
            "MAE's end-to-end fine-tuning of ViT-B/16 on ImageNet-1k (He et al. 2022, Table 9 and the official "
            "FINETUNE.md): the MAE-pretrained encoder (timm/vit_base_patch16_224.mae), global average pooling, "
            "AdamW lr 5e-4 x batch/256, betas 0.9/0.999, weight decay 0.05, layer-wise lr decay 0.65, cosine with "
            "5 warm-up epochs, 100 epochs at batch 1024, RandAugment m9 (mstd 0.5 in the paper; 0 here, as deit), "
            "Mixup 0.8, CutMix 1.0, label smoothing 0.1, random erasing 0.25, stochastic depth 0.1; no EMA (MAE "
            "keeps none). MAE's head pools with a new fc_norm in place of the final norm; here the checkpoint's "
            "final norm stays before the pooling. Expected: 83.6% top-1 (MAE, ViT-B, 1600-epoch pre-training). "
            "On a 2-core machine reach the batch with --grad_accumulation_steps."
        ),
        model=decode_variant("B/16").replace(classifier="gap", drop_path_rate=0.1),
        pretrained="timm/vit_base_patch16_224.mae", learning_rate=5e-4, lr_batch_reference=256, layer_decay=0.65,
        train_steps=125_100, warmup_steps=6_255,
    ),
    "deit": _DEIT,
    "deit_distilled": _DEIT.replace(
        description=(
            "DeiT-B/16 with the distillation token (Touvron et al. 2021, Sec. 4 and Table 5): the deit "
            "recipe with hard-label distillation (alpha 0.5) from a convnet teacher run in the compiled "
            "step: keras.applications.ConvNeXtBase (ImageNet weights; Keras 3 has no RegNetY-16GF, DeiT's). "
            "Expected: DeiT-B distilled reached 83.4% top-1 at 300 epochs with its RegNet teacher."
        ),
        distilled=True, distillation="hard", teacher="keras.applications.ConvNeXtBase", distillation_alpha=0.5,
    ),
    "mpp_pretrain": Recipe(
        description=(
            "Masked patch prediction, the paper's self-supervised pre-training (Sec. 4.6, Appendix B.1.2): "
            "ViT-B/16, 50% of patches corrupted (80% mask embedding, 10% another patch, 10% kept), their "
            "3-bit mean colour predicted (512 classes); Adam lr 2e-4, 10k warm-up steps, cosine, batch 4096, "
            "1M steps on JFT (ImageNet here: JFT is not public). Expected, after fine-tuning the model.npz: "
            "79.9% ImageNet top-1 (paper), 2 points above the same model from scratch."
        ),
        model=decode_variant("B/16"), task="mpp", dataset="tfds:imagenet2012", train_split="train",
        eval_split="validation", train_crop="inception", flip=True, optimizer="adam", learning_rate=2e-4,
        schedule="cosine", warmup_steps=10_000, batch_size=4096, train_steps=1_000_000, checkpoint_every=5000,
    ),
    "cifar10_finetune": Recipe(
        description=(
            "ViT-B/16 (AugReg ImageNet-21k) fine-tuned on CIFAR-10 at 224 px with the paper's "
            "fine-tuning settings (vit_jax/configs/common.py: SGD 0.9, lr 0.03, 500 warm-up, "
            "cosine, clip 1, batch 512, 10k steps). Expected: ~98.9% test top-1 (paper Table 2 "
            "reports 98.13-99.00 for B/16 and L/16)."
        ),
        model=decode_variant("B/16"), pretrained="augreg_in21k", dataset="tfds:cifar10",
        train_split="train", eval_split="test", validation_fraction=0.02, train_crop="inception", flip=True,
        eval_crop_fraction=1.0, optimizer="sgd", learning_rate=0.03, momentum=0.9,
        schedule="cosine", warmup_steps=500, grad_clip_norm=1.0, batch_size=512,
        train_steps=10_000,
    ),
}

# Each string field's accepted values, and each numeric field's domain: (low, high, low_open, high_open).
CHOICES = {name: field.metadata["choices"] for name, field in FIELDS.items() if field.metadata["choices"]}
RANGES = {name: field.metadata["bounds"] for name, field in FIELDS.items() if field.metadata["bounds"]}
# The fields whose augmentation takes RGB images only; set on another dataset, they stop the run.
RGB_ONLY = tuple(name for name, field in FIELDS.items() if field.metadata["rgb_only"])
DATASET_KINDS = ("keras_vit_digits", "tfds:NAME", "folder:PATH", "tfrecord:GLOB")


def _interval(low, high, low_open, high_open):
    return (f"{'(' if low_open else '['}{low}, {'inf' if high is None else high}"
            f"{')' if high_open or high is None else ']'}")


def _check_type(name, value):
    expected = FIELDS[name].type
    expected = {"int": int, "float": float, "str": str, "bool": bool}.get(expected, expected)
    ok = (isinstance(value, expected) and (expected is bool or not isinstance(value, bool))
          or expected is float and isinstance(value, int) and not isinstance(value, bool))
    if not ok:
        raise ValueError(f"`{name}` must be of type {expected.__name__}; received {name}={value!r}")


def _check_range(name, value, low, high, low_open, high_open):
    # NaN fails every comparison, so the test is written as "inside", never "outside".
    inside = (math.isfinite(value) and (value > low if low_open else value >= low)
              and (high is None or (value < high if high_open else value <= high)))
    if not inside:
        raise ValueError(f"`{name}` must be in {_interval(low, high, low_open, high_open)}; "
                         f"received {name}={value!r}")


def _check_dataset(recipe):
    kind, sep, rest = recipe.dataset.partition(":")
    if recipe.dataset != "keras_vit_digits" and not (sep and rest and kind in ("tfds", "folder", "tfrecord")):
        raise ValueError(f"`dataset` must be one of {DATASET_KINDS}; received dataset={recipe.dataset!r}")
    if not recipe.train_split:
        raise ValueError(f"`train_split` must name a split; received train_split={recipe.train_split!r}")
    if not recipe.eval_split and not recipe.validation_fraction:
        raise ValueError("eval_split='' reports the validation split held out of training, and "
                         "validation_fraction=0 holds none out: set --validation_fraction (e.g. 0.1) or name a test "
                         "split with --eval_split")
    if kind == "tfrecord" and not recipe.num_classes:
        raise ValueError(f"TFRecords carry no class count: set `num_classes` >= 1 for dataset={recipe.dataset!r}; "
                         "received num_classes=0")
    if kind == "tfrecord" and "{split}" not in rest:  # else every split reads the same files
        raise ValueError("A TFRecord glob must hold `{split}`, which each split replaces (e.g. "
                         f"'tfrecord:/data/{{split}}-*.tfrecord'), so that evaluation reads other files than "
                         f"training; received dataset={recipe.dataset!r}")


def _check_pretrained(recipe):
    """A weights file must exist and compute as the model does; a name must be one the variant has (no download)."""
    if not recipe.pretrained:
        return
    # Imported here: the checkpoint readers load Keras, which a run from scratch validates without.
    from keras_vit.checkpoints import config_from_checkpoint, resolve_weights, weights_kind

    variant = variant_name(recipe.model)
    if weights_kind(recipe.pretrained) == "pretrained" and not variant:
        raise ValueError(f"`pretrained` weights by name need the model of a named variant (--variant=B/16); "
                         f"received pretrained={recipe.pretrained!r} for an unnamed architecture")
    weights = resolve_weights(recipe.pretrained, variant)  # a name: raises listing the variant's names
    if weights.local and weights.kind != "hub" and not os.path.exists(weights.location):
        raise ValueError(f"`pretrained` must name an existing checkpoint or .weights.h5 file or the variant's "
                         f"pretrained weights; received pretrained={recipe.pretrained!r}: no such file")
    if weights.local and weights.kind in ("file", "directory", "hub"):  # a hub id: from the cache, or fetched
        _check_conventions(recipe.model, config_from_checkpoint(weights.location), recipe.pretrained)


def _check_conventions(model, checkpoint, source):
    """Fine-tuning starts from a checkpoint's function: the fields that define it must be the checkpoint's."""
    differ = [f"{name}={getattr(model, name)!r} (the checkpoint's: {getattr(checkpoint, name)!r})"
              for name in vit_config.differing_conventions(model, checkpoint)]
    if differ:
        raise ValueError(f"The model differs from {source} in what its weights compute: {', '.join(differ)}; "
                         "set these fields to the checkpoint's")


def problems(recipe):
    """Every problem of `recipe`, one message each (empty when it is valid).

    Cheap and pure but for a `pretrained` checkpoint, whose file is read: it runs before the trainer touches the
    data, the devices or the model directory.
    """
    if not isinstance(recipe.model, ViTConfig):
        return [f"`model` must be a keras_vit.ViTConfig; received {type(recipe.model).__name__}"]
    found = []

    def check(function, *args):
        try:
            function(*args)
        except ValueError as error:
            found.append(str(error))
            return False
        return True

    typed = [name for name in FIELDS if check(_check_type, name, getattr(recipe, name))]
    for name, choices in CHOICES.items():
        value = getattr(recipe, name)
        if name in typed and value not in choices:
            found.append(f"`{name}` must be one of {choices}; received {name}={value!r}")
    for name, bounds in RANGES.items():
        if name in typed:
            check(_check_range, name, getattr(recipe, name), *bounds)
    if len(typed) < len(FIELDS):  # the checks below read fields of every type
        return found
    if recipe.randaugment_magnitude_std:  # with or without RandAugment on
        found.append(
            "randaugment_magnitude_std > 0 is not supported: Model Garden 2.20's RandAugment then compares "
            "int32 levels with uint8 pixels in Posterize and Solarize (TypeError); "
            f"received randaugment_magnitude_std={recipe.randaugment_magnitude_std}")
    if recipe.grad_accumulation_steps >= 1 and recipe.batch_size % recipe.grad_accumulation_steps:  # before replicas
        found.append(f"`batch_size` must be a multiple of grad_accumulation_steps={recipe.grad_accumulation_steps} "
                     f"(its micro-batches); received batch_size={recipe.batch_size}")
    check(_check_dataset, recipe)
    check(_check_pretrained, recipe)
    check(_check_task, recipe)
    return found


def validate(recipe):
    """Checks every field's type and domain; raises ValueError naming each field, what is allowed and what came."""
    found = problems(recipe)
    if found:
        raise ValueError("\n".join(found))
    return recipe


def _check_task(recipe):
    """MPP pre-trains a plain ViT from scratch without a teacher; distillation names its teacher."""
    if recipe.task == "mpp":
        needs = (("distillation", recipe.distillation, "none"), ("pretrained", recipe.pretrained, ""),
                 ("resnet_num_layers", recipe.model.resnet_num_layers, None),
                 # It predicts every chosen patch from its own output token.
                 ("patch_dropout", recipe.model.patch_dropout, 0.0),
                 # Mixed images would mix the colours MPP predicts, without mixing its targets.
                 ("mixup_alpha", recipe.mixup_alpha, 0.0), ("cutmix_alpha", recipe.cutmix_alpha, 0.0))
        for name, actual, value in needs:
            if actual != value:
                raise ValueError(f"task='mpp' pre-trains a plain ViT from scratch: it needs {name}={value!r}; "
                                 f"received {name}={actual!r}")
    if recipe.distillation == "none":
        if recipe.teacher:
            raise ValueError(f"`teacher` is set but distillation='none': set --distillation=hard|soft or drop "
                             f"the teacher; received teacher={recipe.teacher!r}")
        return
    if not recipe.teacher:
        raise ValueError(f"distillation={recipe.distillation!r} needs a `teacher` (a .keras file, a SavedModel "
                         "directory or keras.applications.NAME); received teacher=''")
    from trainers import distillation

    distillation.check_teacher_name(recipe.teacher)


def inert_fields(recipe):
    """{field: why}: the fields that change nothing in `recipe` (set on purpose, one is a mistake)."""
    inert = {}
    if recipe.distillation == "none":
        inert.update(dict.fromkeys(("distillation_alpha", "distillation_temperature", "teacher_outputs"),
                                   "distillation='none'"))
    elif recipe.distillation == "hard":
        inert["distillation_temperature"] = "distillation='hard' (only soft distillation softens)"
    if recipe.task == "mpp":
        inert["label_smoothing"] = "task='mpp' (its targets are colours, not labels)"
    if not recipe.randaugment_layers:
        inert["randaugment_magnitude"] = "randaugment_layers=0"
    if not recipe.ema_decay:
        inert["ema_warmup"] = "ema_decay=0 (no average to warm up)"
    if recipe.optimizer == "sgd":
        inert.update(dict.fromkeys(("beta_1", "beta_2"), "optimizer='sgd'"))
    else:
        inert["momentum"] = f"optimizer={recipe.optimizer!r} (momentum is SGD's; Adam's are beta_1 and beta_2)"
    return inert


def check_replicas(recipe, num_replicas):
    """The global batch must split evenly into micro-batches, each over the strategy's replicas."""
    parts = num_replicas * recipe.grad_accumulation_steps
    if recipe.batch_size % parts:
        nearest = max(parts, recipe.batch_size // parts * parts)
        over = (f"{num_replicas} replicas in sync x grad_accumulation_steps={recipe.grad_accumulation_steps}"
                if recipe.grad_accumulation_steps > 1 else f"{num_replicas} replicas in sync")
        raise ValueError(f"`batch_size` must be a multiple of the {over}; received batch_size={recipe.batch_size} "
                         f"(nearest: {nearest})")


def check_eval_every(eval_every, recipe=None):
    """The trainer's --eval_every: steps between evaluations of the validation split, 0 for none before the end."""
    if not isinstance(eval_every, int) or isinstance(eval_every, bool) or eval_every < 0:
        raise ValueError(f"--eval_every must be an int >= 0 (0: at the end only); received eval_every={eval_every!r}")
    if eval_every and recipe is not None and not recipe.validation_fraction:
        raise ValueError(f"--eval_every={eval_every} evaluates on a validation split, and validation_fraction=0 "
                         "holds none out of the training data: set --validation_fraction (e.g. 0.1), or drop "
                         "--eval_every (the test split is reported once, at the end)")


def default_eval_every(recipe):
    """Evaluations on the validation split at every checkpoint; none before the end without a validation split."""
    return recipe.checkpoint_every if recipe.validation_fraction else 0


def check_model_dir(model_dir, recipe):
    """Refuses a model_dir that is a file or holds a run of another recipe; reads only."""
    model_dir = pathlib.Path(model_dir)
    if model_dir.exists() and not model_dir.is_dir():
        raise ValueError(f"--model_dir must be a directory; received model_dir={str(model_dir)!r}, a file")
    saved = model_dir / "recipe.json"
    if saved.exists() and json.loads(saved.read_text()) != json.loads(recipe.to_json()):
        raise ValueError(
            f"{model_dir} holds a run of another recipe ({saved}); use a new --model_dir or the same flags")
