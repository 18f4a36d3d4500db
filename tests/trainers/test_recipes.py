import dataclasses

import pytest

from trainers import recipes
from trainers.train import resolve_recipe


@pytest.mark.parametrize("name", sorted(recipes.RECIPES))
def test_every_recipe_is_valid_and_documented(name):
    recipe = recipes.RECIPES[name]
    if recipe.pretrained.startswith("timm/"):  # a hub id is read from the cache or fetched: offline, its name alone
        assert recipe.pretrained in recipe.description
        recipe = dataclasses.replace(recipe, pretrained="")
    recipes.validate(recipe)
    assert len(recipe.description) > 80


def test_the_papers_numbers():
    pre = recipes.RECIPES["vit_i21k_pretrain"]
    assert (pre.optimizer, pre.beta_1, pre.beta_2, pre.batch_size, pre.warmup_steps, pre.schedule,
            pre.weight_decay, pre.model.dropout_rate) == ("adamw", 0.9, 0.999, 4096, 10_000, "linear", 0.03, 0.1)
    assert pre.model.representation_size == 768 and pre.model.hidden_size == 768
    ft = recipes.RECIPES["vit_finetune"]
    assert (ft.optimizer, ft.momentum, ft.batch_size, ft.schedule, ft.weight_decay, ft.grad_clip_norm,
            ft.model.image_size) == ("sgd", 0.9, 512, "cosine", 0.0, 1.0, (384, 384))
    assert ft.model.representation_size is None and ft.pretrained == "imagenet21k"
    deit = recipes.RECIPES["deit"]
    assert (deit.learning_rate, deit.lr_batch_reference, deit.weight_decay, deit.randaugment_magnitude,
            deit.randaugment_magnitude_std, deit.mixup_alpha, deit.cutmix_alpha, deit.label_smoothing,
            deit.random_erasing, deit.model.drop_path_rate) == (5e-4, 512, 0.05, 9.0, 0.0, 0.8, 1.0, 0.1, 0.25, 0.1)
    assert deit.train_steps == 300 * 1251 and deit.warmup_steps == 5 * 1251  # 1,281,167 / 1024 per epoch


def test_overrides_and_their_errors():
    recipe = resolve_recipe("digits", {"learning_rate": 0.5, "flip": True})
    assert recipe.learning_rate == 0.5 and recipe.flip and recipe.model.hidden_size == 64
    model = resolve_recipe("digits", {"variant": "S/16", "num_layers": 2, "image_size": (32, 48)}).model
    assert (model.hidden_size, model.num_heads, model.num_layers, model.image_size) == (384, 6, 2, (32, 48))
    assert model.classifier == "gap"  # the recipe's, untouched by the variant
    with pytest.raises(ValueError, match=r"Unknown recipe fields \['classes'\]"):  # the dataset's
        resolve_recipe("digits", {"classes": 3})
    with pytest.raises(ValueError, match="`hidden_size` must be divisible by `num_heads`"):
        resolve_recipe("digits", {"num_heads": 5})
    with pytest.raises(ValueError, match=r"Unknown recipe fields \['lerning_rate'\]"):
        resolve_recipe("digits", {"lerning_rate": 0.5})
    with pytest.raises(ValueError,
                       match=r"`optimizer` must be one of \('adam', 'adamw', 'sgd'\); received optimizer='rmsprop'"):
        resolve_recipe("digits", {"optimizer": "rmsprop"})
    with pytest.raises(ValueError, match="received batch_size=0"):
        resolve_recipe("digits", {"batch_size": 0})
    # Model Garden 2.20 fails on uint8 images when the magnitude varies.
    for recipe in ("deit", "digits"):  # RandAugment on and off
        with pytest.raises(ValueError, match="Posterize and Solarize .*received randaugment_magnitude_std=0.5"):
            resolve_recipe(recipe, {"randaugment_magnitude_std": 0.5})


def test_recipes_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        recipes.RECIPES["digits"].batch_size = 1


@pytest.mark.parametrize("flags, message", [
    ({"distillation": "hard", "teacher": "keras.applications.ConvNeXtTiny", "distillation_temperature": 3.0},
     r"--distillation_temperature=3.0 would change nothing with distillation='hard'"),
    ({"distillation_alpha": 0.9}, r"--distillation_alpha=0.9 would change nothing with distillation='none'"),
    ({"teacher_outputs": "logits"}, r"--teacher_outputs='logits' would change nothing"),
    ({"task": "mpp", "label_smoothing": 0.3}, r"--label_smoothing=0.3 would change nothing with task='mpp'"),
    ({"momentum": 0.5}, r"--momentum=0.5 would change nothing with optimizer='adamw'"),
    ({"optimizer": "sgd", "beta_1": 0.5}, r"--beta_1=0.5 would change nothing with optimizer='sgd'"),
    ({"randaugment_magnitude": 20.0}, r"--randaugment_magnitude=20.0 would change nothing with randaugment_layers=0"),
    ({"task": "mpp", "mixup_alpha": 0.8}, r"task='mpp' .* needs mixup_alpha=0.0; received mixup_alpha=0.8"),
    ({"task": "mpp", "patch_dropout": 0.5}, r"task='mpp' .* needs patch_dropout=0.0; received patch_dropout=0.5"),
    ({"seed": 2**32}, r"`seed` must be in \[0, 4294967295\]; received seed=4294967296"),
    ({"ema_warmup": False}, r"--ema_warmup=False would change nothing with ema_decay=0"),
    ({"layer_decay": 0.0}, r"`layer_decay` must be in \(0, 1\]; received layer_decay=0.0"),
    ({"ema_decay": 1.0}, r"`ema_decay` must be in \[0, 1\); received ema_decay=1.0"),
    ({"grad_accumulation_steps": 3}, r"`batch_size` must be a multiple of grad_accumulation_steps=3 \(its "
                                     r"micro-batches\); received batch_size=64"),
    ({"grad_accumulation_steps": 0}, r"`grad_accumulation_steps` must be in \[1, inf\); received "
                                     r"grad_accumulation_steps=0"),
])
def test_a_flag_that_would_change_nothing_is_refused(flags, message):
    with pytest.raises(ValueError, match=message):
        resolve_recipe("digits", flags)
    # The same values as the recipe's own defaults are no mistake: nobody set them.
    inert = recipes.inert_fields(resolve_recipe("digits", {}))
    assert {"distillation_alpha", "momentum", "randaugment_magnitude"} <= set(inert)
