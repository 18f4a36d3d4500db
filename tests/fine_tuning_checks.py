"""Checks of keras_vit.fine_tuning that run on any Keras backend: tests/test_fine_tuning.py runs them on TensorFlow,
tests/backends/backend_checks.py on JAX and PyTorch. Each returns arrays; the tests compare them with the formulas.
"""

import keras
import numpy as np

import keras_vit
from keras_vit.fine_tuning import averaged_weights, fine_tuning_optimizer

LR, DECAY, LAYERS, WEIGHT_DECAY = 1e-3, 0.5, 3, 0.5


def tiny_vit(scan_layers=False):
    """A 3-block ViT with a register token and a head of random weights (so every weight has a gradient)."""
    keras.utils.set_random_seed(0)
    config = keras_vit.ViTConfig(image_size=(16, 16), patch_size=(8, 8), hidden_size=16, num_layers=LAYERS,
                                 num_heads=2, mlp_dim=32, num_register_tokens=1, scan_layers=scan_layers)
    model = keras_vit.ViT(config, classes=3, classifier_activation=None)
    for variable in model.trainable_variables:
        if variable.path.startswith("head/"):
            variable.assign(np.random.default_rng(1).normal(0, 0.1, variable.shape).astype("float32"))
    return model


def batch(count=4, seed=0):
    rng = np.random.default_rng(seed)
    return rng.uniform(-1, 1, (count, 16, 16, 3)).astype("float32"), (np.arange(count) % 3).astype("int32")


def _weights(model):
    return {v.path: keras.ops.convert_to_numpy(v) for v in model.trainable_variables}


def expected_scales(model):
    """{path: the scale the formula gives, one per block for a stacked weight}, written out here, not read from
    keras_vit.layer_decay: blocks decay^(L - i), embeddings decay^(L + 1), the rest 1."""
    scales = {}
    for path in _weights(model):
        parts = path.split("/")
        if parts[0] == "encoder":
            scales[path] = np.array([DECAY ** (LAYERS - i) for i in range(LAYERS)])
        elif parts[0].startswith("encoder_block_"):
            scales[path] = DECAY ** (LAYERS - int(parts[0].rsplit("_", 1)[1]))
        elif parts[0] in ("patch_embedding", "class_token", "register_tokens", "position_embedding"):
            scales[path] = DECAY ** (LAYERS + 1)
        else:
            assert parts[0] in ("encoder_norm", "head"), path
            scales[path] = 1.0
    return scales


def measured_scales(model, weights_before, zero_loss=False):
    """Each weight's median |step| / lr (Adam's first step is lr x scale x g / (|g| + eps), so the scale where
    g >> eps); per block for a stacked weight. With `zero_loss`, |step| / (lr wd |w|) over the weights not 0: the
    decoupled decay's share alone. The key bias is left out: its gradient is 0 but for rounding (softmax ignores it)."""
    measured = {}
    for path, after in _weights(model).items():
        before = weights_before[path].astype("float64")
        with np.errstate(divide="ignore", invalid="ignore"):  # weights at 0 do not decay: left out
            step = np.abs(after - before) / (np.abs(before) * LR * WEIGHT_DECAY if zero_loss else LR)
        stacked = path.startswith("encoder/")
        slices = [step[i] for i in range(len(step))] if stacked else [step]
        kept = [s[np.isfinite(s)] for s in slices]
        if "key_bias" in path or any(not k.size for k in kept):
            continue
        measured[path] = np.array([np.median(k) for k in kept]) if stacked else np.median(kept[0])
    return measured


def first_step(optimizer_class, scan_layers=False, zero_loss=False):
    """`(measured, expected)` scales of one step of `optimizer_class` (Adam-like) with layer decay 0.5."""
    model = tiny_vit(scan_layers)
    before = _weights(model)
    base = optimizer_class(LR, epsilon=1e-12, weight_decay=WEIGHT_DECAY if zero_loss else None)
    model.compile(optimizer=fine_tuning_optimizer(base, model, layer_decay=DECAY),
                  loss=(lambda y, p: 0.0 * keras.ops.sum(p)) if zero_loss
                  else keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.train_on_batch(*batch())
    return measured_scales(model, before, zero_loss), expected_scales(model)


def ema_trajectory(warmup, steps=4):
    """`(weights after each step, the average after the last, its decay)`: SGD steps with an EMA of decay 0.9."""
    model = tiny_vit()
    optimizer = fine_tuning_optimizer(keras.optimizers.SGD(0.1), ema_decay=0.9, ema_warmup=warmup, ema_finalize=False)
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    trajectory = []
    for step in range(steps):
        model.train_on_batch(*batch(seed=step))
        trajectory.append(_weights(model))
    with averaged_weights(model):
        average = _weights(model)
    return trajectory, average, _weights(model)


def expected_average(trajectory, warmup, decay=0.9):
    """timm's ModelEmaV3: the first update copies; update n + 1 uses min(decay, 1 - (1 + n)^(-2/3)) if warmup."""
    average = dict(trajectory[0])
    for n, weights in enumerate(trajectory[1:], start=1):
        d = min(decay, 1 - (1 + n) ** (-2 / 3)) if warmup else decay
        average = {path: d * average[path] + (1 - d) * weights[path] for path in average}
    return average


def accumulated_and_whole(steps=2):
    """Weights after `steps` SGD updates of 2 accumulated micro-batches of 4, and after the same updates on whole
    batches of 8 (the same images)."""
    out = []
    for accumulation in (2, None):
        model = tiny_vit()
        model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9, gradient_accumulation_steps=accumulation),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        for step in range(steps):
            images, labels = batch(8, seed=step)
            if accumulation:
                for half in (slice(0, 4), slice(4, 8)):
                    model.train_on_batch(images[half], labels[half])
            else:
                model.train_on_batch(images, labels)
        out.append(_weights(model))
    return out


def _worst(measured, expected):
    """The largest relative deviation of a measured scale from the formula's (1.0 when under 12 weights measured)."""
    if len(measured) < 12:
        return 1.0
    return max(np.max(np.abs(measured[p] / expected[p] - 1)) for p in measured)


def run():
    """Every check's deviation from its formula, as arrays for the backend tests (all should be ~0); the unrolled
    blocks' grouping is backend-free Python, checked on TensorFlow."""
    out = {}
    measured, expected = first_step(keras.optimizers.Adam, scan_layers=True)  # stacked blocks, single embeddings
    out["layer_decay"] = _worst(measured, expected)
    measured, expected = first_step(keras.optimizers.AdamW, True, zero_loss=True)
    out["weight_decay"] = _worst(measured, expected)
    trajectory, average, restored = ema_trajectory(warmup=True)
    wanted = expected_average(trajectory, warmup=True)
    out["ema"] = max(np.max(np.abs(average[p] - wanted[p])) for p in wanted)
    out["ema_restored"] = max(np.max(np.abs(restored[p] - trajectory[-1][p])) for p in wanted)
    accumulated, whole = accumulated_and_whole()
    out["accumulation"] = max(np.max(np.abs(accumulated[p] - whole[p])) for p in whole)
    return {f"fine_tuning:{key}": np.array(value) for key, value in out.items()}
