"""Layer-wise learning-rate decay and a weight EMA with warm-up, for any Keras optimiser, on every backend.

    optimizer = keras_vit.fine_tuning.fine_tuning_optimizer(
        keras.optimizers.AdamW(1e-3, weight_decay=0.05), model, layer_decay=0.65, ema_decay=0.9999)
    model.compile(optimizer=optimizer, loss=...)

The returned optimiser is the given one (same class, same arguments) with two options of the fine-tuning recipes:

- `layer_decay`: each weight's learning rate, and so its decoupled weight decay (w -= lr wd w), is scaled by its
  depth's factor (`keras_vit.layer_decay`), as timm's `param_groups_layer_decay` groups scale theirs.
- `ema_decay`: Keras' own `use_ema` average (an optimiser variable, so checkpoints hold it), updated once per
  optimiser step, with timm's `ModelEmaV3` warm-up when `ema_warmup`: after update n the decay is
  min(ema_decay, 1 - n^(-2/3)), so the average forgets its random start. At the end of `fit` the model takes the
  average, as Keras' `use_ema` does, unless `ema_finalize=False` (a loop that fits in chunks); either way
  `averaged_weights(model)` lends the model the average for an evaluation or a save.

Both work through the optimiser's own hooks (`_backend_update_step`, `_apply_weight_decay`,
`_update_model_variables_moving_average`), which every backend's optimiser calls; each group of weights with one
scale takes the backend's own update, at its rate.
"""

import contextlib

import keras
from keras import ops

from keras_vit import layer_decay as depth
from keras_vit import optimizers as fused

# timm's ModelEmaV3 warm-up: decay = 1 - (1 + n / gamma)^-power after n updates past the first, gamma 1.
WARMUP_POWER = 2.0 / 3.0


class FineTuning:
    """Mixin over a Keras optimiser class: per-weight rate scales (layer decay) and an EMA with warm-up."""

    def __init__(self, *args, layer_decay_scales=None, ema_warmup=True, ema_finalize=True, **kwargs):
        super().__init__(*args, **kwargs)
        self.layer_decay_scales = dict(layer_decay_scales or {})
        self.ema_warmup = bool(ema_warmup)
        self.ema_finalize = bool(ema_finalize)

    def build(self, variables):
        missing = [v.path for v in variables if self.layer_decay_scales and v.path not in self.layer_decay_scales]
        if missing:
            raise ValueError(f"The layer-decay scales were made for another model: no scale for {missing[:3]} "
                             f"({len(missing)} of {len(variables)} weights). Make the optimiser from this model")
        super().build(variables)

    # Layer decay: each group of weights with one scale takes the backend's own update at its scaled rate.

    def _scale_groups(self, *lists):
        """`[(scale, [items of each list])]`: scalar scales grouped; each stacked weight alone (its own shape)."""
        groups = {}
        variables = lists[-1]
        for i, variable in enumerate(variables):
            scale = self.layer_decay_scales[variable.path]
            key = ("stacked", variable.path) if isinstance(scale, list) else scale
            groups.setdefault(key, (scale, len(variable.shape), [[] for _ in lists]))
            for items, source in zip(groups[key][2], lists, strict=True):
                items.append(source[i])
        return [(self._scale_value(scale, rank), items) for scale, rank, items in groups.values()]

    @staticmethod
    def _scale_value(scale, rank):
        if isinstance(scale, list):  # one scale per block, broadcast over the stacked weight
            return ops.convert_to_tensor(depth.stacked_shape(scale, rank))
        return scale

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        if not self.layer_decay_scales:
            return super()._backend_update_step(grads, trainable_variables, learning_rate)
        for scale, (group_grads, group_variables) in self._scale_groups(grads, trainable_variables):
            rate = learning_rate * scale if isinstance(scale, float) else ops.multiply(
                ops.cast(learning_rate, "float32"), scale)
            if not isinstance(scale, float) and keras.backend.backend() == "torch":
                # PyTorch's fused (foreach) updates take one scalar rate; Keras' per-weight update broadcasts.
                for gradient, variable in zip(group_grads, group_variables, strict=True):
                    self.update_step(gradient, variable, rate)
            else:
                super()._backend_update_step(group_grads, group_variables, rate)

    def _apply_weight_decay(self, variables):
        if self.weight_decay is None or not self.layer_decay_scales:
            return super()._apply_weight_decay(variables)
        weight_decay = self.weight_decay
        try:
            for scale, (group,) in self._scale_groups(variables):
                # w -= lr wd w at the group's rate; the backend reads `weight_decay` as it builds the update.
                self.weight_decay = weight_decay * scale
                if not isinstance(scale, float) and keras.backend.backend() == "torch":
                    self._decay_each(group)  # PyTorch's fused decay takes one scalar rate
                else:
                    super()._apply_weight_decay(group)
        finally:
            self.weight_decay = weight_decay

    def _decay_each(self, variables):
        for variable in variables:
            if self._use_weight_decay(variable):
                rate = ops.cast(self.learning_rate, variable.dtype) * ops.cast(self.weight_decay, variable.dtype)
                variable.assign(variable - variable * rate)

    # The EMA: Keras' average variables, updated once per optimiser step with timm's warm-up.

    def _update_model_variables_moving_average(self, trainable_variables):
        if not self.use_ema:
            return
        updates = self.iterations  # optimiser updates before this one (Keras counts after the EMA)
        decay = ops.minimum(ops.cast(self.ema_momentum, "float32"), self._warmup_decay(updates))
        decay = ops.where(ops.equal(updates, 0), 0.0, decay)  # the first update copies the weights
        if self.gradient_accumulation_steps:  # Keras calls this after every micro-batch: move only on updates
            is_update = ops.equal((self._iterations + 1) % self.gradient_accumulation_steps, 0)
            decay = ops.where(is_update, decay, 1.0)
        for variable, average in zip(trainable_variables, self._model_variables_moving_average, strict=True):
            if average is not None:
                d = ops.cast(decay, variable.dtype)
                average.assign(d * average + (1 - d) * variable)

    def _warmup_decay(self, updates):
        if not self.ema_warmup:
            return ops.cast(1.0, "float32")
        return 1.0 - ops.power(1.0 + ops.cast(updates, "float32"), -WARMUP_POWER)

    def finalize_variable_values(self, var_list):
        if self.ema_finalize:
            super().finalize_variable_values(var_list)

    def get_config(self):
        return {**super().get_config(), "layer_decay_scales": self.layer_decay_scales,
                "ema_warmup": self.ema_warmup, "ema_finalize": self.ema_finalize}


_CLASSES = {}


def fine_tuning_class(base):
    """The registered class `FineTuning` over `base` (one per base; a backend's variant maps to Keras' class)."""
    if base.__module__.startswith("keras.") and base not in KERAS_OPTIMIZERS:  # a backend's variant: PyTorch's
        base = next(c for c in base.__mro__ if c in KERAS_OPTIMIZERS)  # fused Adam is keras.optimizers.Adam
    if issubclass(base, FineTuning):
        return base
    if base not in _CLASSES:
        registered = keras.saving.get_registered_name(base).replace(">", "_")
        cls = type(f"FineTuning_{registered}", (FineTuning, base), {
            "__doc__": f"{base.__name__} with keras_vit's layer decay and EMA warm-up (`keras_vit.fine_tuning`)."})
        _CLASSES[base] = keras.saving.register_keras_serializable(package="keras_vit")(cls)
    return _CLASSES[base]


def fine_tuning_optimizer(optimizer, model=None, *, layer_decay=None, ema_decay=None, ema_warmup=True,
                          ema_finalize=True):
    """`optimizer` (an unbuilt Keras optimiser) with layer decay over `model`'s weights and/or a weight EMA.

    Args:
        optimizer: a Keras optimiser instance, not yet built.
        model: the model whose weights it will train (needed for `layer_decay`): a keras_vit ViT or a model
            holding one.
        layer_decay: float in (0, 1]: block i of L takes decay^(L - i) of the rate, the embeddings decay^(L + 1).
        ema_decay: float in (0, 1): the weight average's decay per optimiser step.
        ema_warmup: timm's warm-up of the EMA decay (min(ema_decay, 1 - n^(-2/3)) after update n).
        ema_finalize: whether `fit` ends with the average in the model (Keras' `use_ema`).

    Raises:
        ValueError: a value out of range, a built optimiser, or layer decay without a model.
    """
    if optimizer.built:
        raise ValueError("fine_tuning_optimizer takes an optimiser not yet built (its slots are made for the "
                         "weights it trains); received a built one")
    if layer_decay is not None and model is None:
        raise ValueError("layer_decay groups a model's weights by depth: pass the model too")
    if ema_decay is not None and not 0.0 < ema_decay < 1.0:
        raise ValueError(f"`ema_decay` must be in (0, 1); received {ema_decay!r}")
    config = optimizer.get_config()
    if ema_decay is not None:
        config.update(use_ema=True, ema_momentum=float(ema_decay), ema_overwrite_frequency=None)
    config.update(layer_decay_scales=depth.layer_decay_scales(model, layer_decay) if layer_decay else None,
                  ema_warmup=ema_warmup, ema_finalize=ema_finalize)
    config.pop("name", None)
    return fine_tuning_class(type(optimizer)).from_config(config)


@contextlib.contextmanager
def averaged_weights(model, optimizer=None):
    """Lends `model` its optimiser's weight average for the `with` block, then gives its weights back.

    Without an EMA (`use_ema` off) the weights are left as they are.
    """
    optimizer = optimizer or model.optimizer
    if not getattr(optimizer, "use_ema", False) or not optimizer.built:
        yield model
        return
    pairs = [(v, a) for v, a in zip(optimizer._trainable_variables, optimizer._model_variables_moving_average,
                                    strict=True) if a is not None]
    kept = [ops.convert_to_numpy(variable) for variable, _ in pairs]
    try:
        for variable, average in pairs:
            variable.assign(average)
        yield model
    finally:
        for (variable, _), value in zip(pairs, kept, strict=True):
            variable.assign(value)


# Keras' optimisers (not the base class nor the loss-scale wrapper): each gets its registered class at import, so
# a saved model's optimiser loads wherever keras_vit is imported.
KERAS_OPTIMIZERS = {value for name, value in vars(keras.optimizers).items()
                    if isinstance(value, type) and issubclass(value, keras.optimizers.Optimizer)
                    and value is not keras.optimizers.Optimizer and not name.startswith("Loss")}
for _base in (*KERAS_OPTIMIZERS, *fused.FUSED.values()):
    fine_tuning_class(_base)
