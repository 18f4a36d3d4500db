"""`ViT(config)` and the named builders `ViT_B16()`, `ViT_L16()`, ...

The model of Dosovitskiy et al., "An Image is Worth 16x16 Words" (ICLR
2021), following google-research/vision_transformer (`models_vit.py`) so its
checkpoints load one to one, with the `keras.applications` signature. The
builder is a composition of named steps: input, embedding, encoder, pooling,
head; each reads the `ViTConfig`. The steps up to the encoder (`image_input`,
`patch_grid`, `token_sequence`, `encode`) are public: networks built on the
ViT's own layers, such as masked patch prediction (`keras_vit.mpp`), compose them.
"""

import logging
import os
import re

import keras

from keras_vit import _onednn, checkpoints, positions, preprocessing
from keras_vit import layers as vit_layers
from keras_vit.checks import check_choice, check_input_shape
from keras_vit.config import FIELDS, IMAGENET_MEAN, IMAGENET_STD, ViTConfig
from keras_vit.layers.drop_path import linear_rate
from keras_vit.layers.norms import norm
from keras_vit.layers.scanned_encoder import block_name
from keras_vit.variants import VARIANTS

POOLINGS = (None, "token", "avg", "max")


@keras.saving.register_keras_serializable(package="keras_vit")
class ViTModel(keras.Model):
    """A functional ViT that carries its `ViTConfig` (`vit_config`).

    Keras saves and restores the layer graph as for any functional model
    (dtype policies and an `input_tensor`'s upstream layers included); the
    configuration rides along in `get_config()`.
    """

    # *args/**kwargs: Keras serialises a functional subclass only when its
    # constructor looks like that of Keras' Functional class.
    def __init__(self, *args, vit_config=None, **kwargs):
        super().__init__(*args, **kwargs)
        if isinstance(vit_config, dict):
            vit_config = ViTConfig.from_dict(vit_config)
        self.vit_config = vit_config

    def make_train_function(self, force=False):
        # Keras' TensorFlow trainer builds an unbuilt optimizer inside the first traced step when no
        # tf.distribute strategy is set, and tf.function traces a step that creates variables twice:
        # built here, the first step is traced once, which shortens it (BUILD.md).
        if keras.backend.backend() == "tensorflow":
            _onednn.warn_if_off()
            if self.optimizer is not None and not self.optimizer.built:
                with self.distribute_strategy.scope():
                    self.optimizer.build(self.trainable_variables)
        return super().make_train_function(force)

    def compile(self, optimizer="rmsprop", *args, **kwargs):
        """Keras' `compile`; on TensorFlow, Adam and AdamW run keras_vit's fused update.

        The strings "adam" and "adamw" give `keras_vit.optimizers.Adam` and `AdamW`, subclasses of Keras' own
        with Keras' defaults and the same config. An instance of exactly `keras.optimizers.Adam` or `AdamW` becomes
        one in place: the same object, arguments and state, only its class the subclass. Their update runs
        TensorFlow's Adam kernel, one graph node per variable instead of about forty, the same formula, which
        shortens the first training step by seconds. Other optimizers, other strings and other backends are
        Keras' own.
        """
        if keras.backend.backend() == "tensorflow":
            from keras_vit import optimizers

            optimizer = optimizers.fused(optimizer)
        return super().compile(optimizer, *args, **kwargs)

    def compile_from_config(self, config):
        # Keras' own skips compiling a model whose class overrides `compile` (its arguments could differ);
        # this `compile` takes Keras' arguments, so a loaded `.keras` file comes back compiled, as Keras' does.
        self.compile(**keras.saving.deserialize_keras_object(config))
        if self.built and self.optimizer is not None:
            self.optimizer.build(self.trainable_variables)  # the saved optimizer variables load into these

    def __call__(self, *args, **kwargs):
        # Keras' own check of a functional model's input adds or drops a last axis of 1 (a grey model took
        # (n, h, w) and RGB) and passes sizes a traced function left unknown; this one runs first, on every
        # call and every trace.
        if args:
            args = (self._checked_images(args[0]), *args[1:])
        elif "inputs" in kwargs:
            kwargs["inputs"] = self._checked_images(kwargs["inputs"])
        return super().__call__(*args, **kwargs)

    def _checked_images(self, x):
        """`x`, refused with a ValueError naming both shapes unless it has the rank and fixed sizes of the input.

        The batch axis, and height and width of a `dynamic_image_size` model,
        take any size. On TensorFlow, sizes unknown while tracing are checked
        when the graph runs (`tf.ensure_shape`, which XLA keeps), and are
        static after it. Structures (lists, dicts) and models of several
        inputs are left to Keras.
        """
        unknown = self._refuse_wrong_shape(x)
        if unknown and keras.backend.backend() == "tensorflow" and not keras.backend.is_keras_tensor(x):
            # tf.function's reduce_retracing (Keras' predict_function) relaxes a signature to unknown sizes
            # after a call of another shape: without this, an image of any size would reach the layers,
            # whose position table is resampled to its grid, and give scores without a word.
            import tensorflow as tf

            return tf.ensure_shape(x, (None, *self.inputs[0].shape[1:]))
        return x

    def _refuse_wrong_shape(self, x):
        """Raises a ValueError naming both shapes where `x` (a tensor, array or TensorSpec) cannot be the input;
        returns whether a size the input fixes is still unknown (a traced graph's)."""
        if getattr(self, "vit_config", None) is None or len(self.inputs) != 1 or not hasattr(x, "shape"):
            return False  # a model without its config (being built or loaded) is Keras' to check
        expected, received = (None, *self.inputs[0].shape[1:]), _static_shape(x)
        check_input_shape(expected, received, f"The model {self.name!r}", self._patch_multiple())
        return received is None or any(r is None and e is not None for e, r in zip(expected, received, strict=True))

    def _patch_multiple(self):
        """The patch size where the input goes straight to the patches of a `dynamic_image_size` model, else
        None (a fixed size is checked as such; a hybrid's stem and an `input_tensor`'s layers change sizes)."""
        config = self.vit_config
        if not config.dynamic_image_size or config.resnet_num_layers is not None:
            return None
        patches = next((layer for layer in self.layers if layer.name == "patch_embedding"), None)
        return config.patch_size if patches is not None and patches.input is self.inputs[0] else None

    def predict(self, x, *args, check_input_range=True, **kwargs):
        """Keras' `predict`, with three checks where `x` is one array (numpy or a tensor).

        Its shape is checked before Keras traces anything: a wrong one raises
        ValueError naming the shapes expected and received. An empty batch
        gives empty outputs (Keras' own loop fails on one). With
        `check_input_range`, images that `preprocess_input` did not scale (raw
        pixels) raise ValueError naming the range expected and received, and a
        batch scaled twice draws a warning (`keras_vit.preprocessing.check_input_range`).
        A `tf.data.Dataset`'s batch shape is checked too; generators are
        checked by `__call__` when traced. The range of both passes unchecked,
        since a layer-level check would be a graph assertion, which XLA
        compiles away.
        """
        spec = getattr(x, "element_spec", None)  # a tf.data.Dataset: its batches' shape, (x, ...) or x
        spec = spec[0] if isinstance(spec, tuple) and spec else spec
        # Checked before Keras traces: a trace of its relaxed signature could only fail when it runs.
        self._refuse_wrong_shape(spec)
        if hasattr(x, "shape") and hasattr(x, "dtype") and self.vit_config is not None:
            self._refuse_wrong_shape(x)
            if check_input_range and len(x.shape) == 4:
                preprocessing.check_input_range(x, self.vit_config, "ViTModel.predict's images")
            if len(x.shape) and not x.shape[0]:
                return keras.tree.map_structure(keras.ops.convert_to_numpy, self(x, training=False))
        return super().predict(x, *args, **kwargs)

    def predict_on_batch(self, x):
        """Keras' `predict_on_batch`, with `predict`'s shape check before Keras traces anything."""
        self._refuse_wrong_shape(x)
        return super().predict_on_batch(x)

    def get_config(self):
        config = super().get_config()
        if self.vit_config is not None:
            config["vit_config"] = self.vit_config.to_dict()
        return config


def _static_shape(x):
    """The sizes of `x` known now (None where a traced graph leaves one open), or None for an unknown rank."""
    try:
        return tuple(None if size is None else int(size) for size in x.shape)
    except (TypeError, ValueError):  # TensorFlow's shape of unknown rank cannot be iterated
        return None


def resolve_config(config, fields, input_shape=None, input_tensor=None):
    """The `ViTConfig` of a build: `config` (or the defaults) with `fields` and the input's shape applied."""
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        raise TypeError(f"ViT() got unknown argument(s) {unknown}; the architecture fields are {sorted(FIELDS)}")
    if config is None:
        config = ViTConfig(**fields)
    elif not isinstance(config, ViTConfig):
        raise TypeError(f"`config` must be a keras_vit.ViTConfig; received {type(config).__name__}")
    else:
        config = config.replace(**fields)
    return _with_input_shape(config, input_shape, input_tensor, explicit_size="image_size" in fields)


def _with_input_shape(config, input_shape, input_tensor, explicit_size):
    """`config` with the image size and channels of `input_shape` (or `input_tensor`'s)."""
    if input_shape is None and input_tensor is not None:
        input_shape = tuple(input_tensor.shape[1:])
    if input_shape is None:
        return config
    input_shape = tuple(input_shape)
    if len(input_shape) != 3:
        raise ValueError(f"`input_shape` must be (height, width, channels); received input_shape={input_shape}")
    spatial, channels = input_shape[:2], input_shape[2]
    changes = {} if channels in (None, config.channels) else _channel_changes(config, channels)
    if None not in spatial:
        if explicit_size and config.image_size != spatial:
            raise ValueError("`image_size` and `input_shape` disagree: received "
                             f"image_size={config.image_size} and input_shape={input_shape}")
        changes["image_size"] = spatial
    elif not config.dynamic_image_size:
        raise ValueError("An input of unknown height or width needs dynamic_image_size=True; "
                         f"received input_shape={input_shape}")
    return config.replace(**changes)


def _channel_changes(config, channels):
    """Another channel count keeps a normalisation that is the same for every channel (as the official one)."""
    if len(set(config.input_mean)) > 1 or len(set(config.input_std)) > 1:
        raise ValueError(f"input_shape has {channels} channels, but the configuration normalises its "
                         f"{config.channels} channels differently (input_mean={config.input_mean}, "
                         f"input_std={config.input_std}): pass input_mean and input_std for {channels} channels")
    return dict(channels=channels, input_mean=config.input_mean[:1] * channels,
                input_std=config.input_std[:1] * channels)


def _check_top(config, include_top, pooling):
    """Whether the model gets its head: `include_top` checked against the configuration."""
    check_choice(pooling, POOLINGS, "pooling")
    include_top = config.classes > 0 if include_top is None else include_top
    if include_top and not config.classes:
        raise ValueError("include_top=True needs a head: the configuration has classes=0 (no head); "
                         "pass classes=N or include_top=False")
    if pooling == "token" and not include_top and not config.class_token:  # ignored with the top, as Keras
        raise ValueError(f"pooling='token' needs a class token; received classifier={config.classifier!r} "
                         f"and class_token={config.class_token}")
    return include_top


def image_input(config, input_tensor=None):
    """`(inputs, images)`: the model's Input(s) and the image tensor its layers start from."""
    height, width = (None, None) if config.dynamic_image_size else config.image_size
    shape = (height, width, config.channels)
    if input_tensor is None:
        images = keras.Input(shape=shape, name="images")
        return images, images
    if keras.backend.is_keras_tensor(input_tensor):
        # As keras.applications: the model starts at the tensor's own Input(s).
        inputs = keras.utils.get_source_inputs(input_tensor)
        return (inputs[0] if len(inputs) == 1 else inputs), input_tensor
    images = keras.Input(tensor=input_tensor, shape=shape, name="images")
    return images, images


def _embed(config, images):
    """Images to the token sequence: [stem], patches, [class token], positions, dropout, [PatchDropout]; the
    tokens' rotary coordinates where a `dynamic_image_size` grid sets them at run time (else None); and the kept
    tokens' places where PatchDropout's must turn rotary positions (else None)."""
    patches = patch_grid(config, images)
    tokens, token_indices = patch_dropout(config, token_sequence(config, patches))
    return tokens, rotary_coordinates(config, patches), token_indices


def patch_dropout(config, tokens):
    """`(tokens, token_indices)`: PatchDropout's kept tokens in training, after the positions and their dropout
    (timm's `patch_drop`), and with rotary positions each kept token's place; `(tokens, None)` at rate 0."""
    if not config.patch_dropout:
        return tokens, None
    layer = vit_layers.PatchDropout(config.patch_dropout, config.num_prefix_tokens,
                                    return_indices=config.rotary_embedding is not None, name="patch_dropout")
    return layer(tokens) if config.rotary_embedding else (layer(tokens), None)


def rotary_coordinates(config, patches):
    """The tokens' rotary coordinates for the run-time grid of `patches`; None where `grid_size` sets them."""
    if config.rotary_embedding is None or not config.dynamic_image_size:
        return None
    return vit_layers.RotaryCoordinates(config.rotary_embedding, config.num_prefix_tokens,
                                        config.rope_reference_grid, name="rotary_coordinates")(patches)


def patch_grid(config, images):
    """Images to the `(batch, height, width, hidden)` grid of patch embeddings, behind the stem of a hybrid."""
    features = images
    if config.resnet_num_layers is not None:
        features = vit_layers.ResNetStem(config.resnet_num_layers, config.resnet_width_factor,
                                         name="resnet_stem")(images)
    patches = vit_layers.PatchEmbedding(config.patch_size, config.hidden_size, use_bias=config.patch_bias,
                                        name="patch_embedding")(features)
    if config.patch_norm:  # each patch's embedding, before the positions (timm's patch_embed.norm, AIMv2)
        patches = norm(config.norm_layer, config.layer_norm_epsilon, "patch_norm")(patches)
    return patches


def token_sequence(config, patches):
    """The patch grid to the token sequence: [class token], positions, dropout."""
    prefix = _prefix_tokens(config, patches)
    # A kind that biases attention lives in the blocks; this layer then only assembles the sequence.
    kind = positions.get(config.position_embedding)
    tokens = vit_layers.PositionEmbedding(
        config.position_embedding if kind.adds_to_tokens else "none",
        grid_size=config.grid_size,
        num_prefix_tokens=config.num_prefix_tokens,
        interpolation=config.interpolation,
        prefix_positions=not config.no_embed_class,
        name="position_embedding",
    )(patches, prefix_tokens=prefix)
    return keras.layers.Dropout(config.dropout_rate, name="embedding_dropout")(tokens)


def _prefix_tokens(config, patches):
    """The class token, DeiT's distillation token or the register tokens after it (timm's order); None for none."""
    prefix = []
    if config.class_token:
        prefix.append(vit_layers.ClassToken(name="class_token")(patches))
    if config.distilled:
        prefix.append(vit_layers.DistillationToken(name="distillation_token")(patches))
    if config.num_register_tokens:
        prefix.append(vit_layers.RegisterTokens(config.num_register_tokens, name="register_tokens")(patches))
    if len(prefix) < 2:
        return prefix[0] if prefix else None
    return keras.layers.Concatenate(axis=1, name="prefix_tokens")(prefix)


def encode(config, tokens, coordinates=None, token_indices=None):
    """[norm "norm_pre"], then the encoder blocks, unrolled or as one `ScannedEncoder` (given the tokens' rotary
    `coordinates` for a run-time grid, and PatchDropout's `token_indices`)."""
    if config.norm_pre:  # after the positions and their dropout, as timm's norm_pre and CLIP's ln_pre
        tokens = norm(config.norm_layer, config.layer_norm_epsilon, "norm_pre")(tokens)
    relative = config.position_embedding if positions.get(config.position_embedding).biases_attention else None
    block_config = dict(
        num_heads=config.num_heads,
        mlp_dim=config.mlp_dim,
        dropout_rate=config.dropout_rate,
        attention_dropout_rate=config.attention_dropout_rate,
        layer_norm_epsilon=config.layer_norm_epsilon,
        gelu_approximate=config.gelu_approximate,
        activation=config.activation,
        qkv_bias=config.qkv_bias,
        layer_scale_init=config.layer_scale_init,
        qk_norm=config.qk_norm,
        norm_layer=config.norm_layer,
        gated_mlp=config.gated_mlp,
        attention_norm=config.attention_norm,
        mlp_norm=config.mlp_norm,
        rotary_embedding=config.rotary_embedding,
        rope_theta=config.rope_theta,
        rope_reference_grid=config.rope_reference_grid,
        relative_position=relative,
        grid_size=config.grid_size if relative or config.rotary_embedding else None,
        num_prefix_tokens=config.num_prefix_tokens,
        interpolation=config.interpolation,
        remat=config.remat,
    )
    # Passed only when there are some, so the graph of a model without them is saved as before.
    places = {} if token_indices is None else {"token_indices": token_indices}
    if config.scan_layers:
        block_config["drop_path_rate"] = config.drop_path_rate  # the last block's: each block gets its linear_rate
        return vit_layers.ScannedEncoder(config.num_layers, block_config, name="encoder")(
            tokens, coordinates=coordinates, **places)
    for i in range(config.num_layers):
        rate = linear_rate(config.drop_path_rate, i, config.num_layers)
        tokens = vit_layers.EncoderBlock(**block_config, drop_path_rate=rate, name=block_name(i))(
            tokens, coordinates=coordinates, **places)
    return tokens


def _pool(config, tokens, pooling):
    """The sequence to one vector: final norm (before or, with `fc_norm`, after pooling), [projection],
    [pre_logits]."""
    final_norm = lambda name: norm(config.norm_layer, config.layer_norm_epsilon, name)  # noqa: E731
    if not config.fc_norm:
        tokens = final_norm("encoder_norm")(tokens)
    mode = {None: config.classifier, "token": "token", "avg": "gap", "max": "max"}[pooling]
    if mode == "map":  # big_vision's MAP head: a learned probe attends over the patch tokens
        features = vit_layers.MAPHead(config.num_heads, config.mlp_dim, config.num_prefix_tokens,
                                      config.layer_norm_epsilon, config.gelu_approximate, config.activation,
                                      name="map_head")(tokens)
    else:
        features = vit_layers.SequencePooling(mode, config.num_prefix_tokens, name="pooling")(tokens)
    if config.distilled and pooling is None:  # DeiT: the distillation token's vector beside the class token's
        return [features, vit_layers.SequencePooling("distillation", config.num_prefix_tokens,
                                                     name="distillation_pooling")(tokens)]
    if config.fc_norm:
        features = final_norm("fc_norm")(features)
    if config.projection_dim:  # CLIP's visual_projection: the image embedding
        features = keras.layers.Dense(config.projection_dim, use_bias=False, name="projection")(features)
    if config.representation_size:
        features = keras.layers.Dense(config.representation_size, activation="tanh", name="pre_logits")(features)
    return features


def _head(config, features, classifier_activation, name="head"):
    """The classification head; for a distilled model DeiT's inference rule: the two heads' logits
    averaged, then the activation."""
    # Computed in the variable dtype, so logits are float32 under mixed precision.
    dtype = keras.mixed_precision.dtype_policy().variable_dtype
    if isinstance(features, list):
        heads = [_head(config, f, None, n) for f, n in zip(features, ("head", "head_dist"), strict=True)]
        logits = keras.layers.Average(dtype=dtype, name="distilled_average")(heads)
        if classifier_activation is None:
            return logits
        return keras.layers.Activation(classifier_activation, dtype=dtype, name="predictions")(logits)
    # The head starts at zero (the paper's fine-tuning rule).
    return keras.layers.Dense(config.classes, activation=classifier_activation, kernel_initializer="zeros",
                              bias_initializer="zeros", dtype=dtype, name=name)(features)


def ViT(
    config=None,
    *,
    include_top=None,
    weights=None,
    input_tensor=None,
    input_shape=None,
    pooling=None,
    classifier_activation="softmax",
    name="vit",
    **fields,
):
    """Builds a Vision Transformer from a `ViTConfig` and/or its fields.

        image -> [ResNetStem] -> PatchEmbedding -> [norm "patch_norm"]
              -> [ClassToken [DistillationToken | RegisterTokens]]
              -> PositionEmbedding -> Dropout -> [PatchDropout] -> [norm "norm_pre"]
              -> EncoderBlock x num_layers (or one ScannedEncoder)
              -> norm "encoder_norm" -> SequencePooling (or MAPHead "map_head", `classifier="map"`)
              -> [norm "fc_norm"] -> [Dense "projection" | Dense tanh "pre_logits"] -> Dense "head"
              (DeiT, `distilled=True`: the distillation token's Dense "head_dist" beside it, averaged)

    Args:
        config: optional `keras_vit.ViTConfig`; `fields` override it.
            Without it, the fields given build one (its defaults are ViT-B/16
            at 224 px).
        include_top: bool. Add the classification head (`config.classes`
            classes); without it the model returns the pooled features.
            Defaults to True when `classes > 0`.
        weights: None; the path or URL of a checkpoint (an official `.npz`,
            local, `gs://` or `https://`, downloaded once into the Keras
            cache; a timm / Hugging Face `.safetensors` file or directory);
            or a Keras weights file (`*.weights.h5`). Position tables are
            resized to the model's grid; a head of other `classes`, or one
            the file lacks, restarts at zero; a `pre_logits` layer the model
            lacks is dropped (the official fine-tuning). To build the model
            a checkpoint describes, use `ViT.from_checkpoint(path)`.
        input_tensor: optional Keras tensor (output of `keras.Input`) to
            use as the image input.
        input_shape: optional `(height, width, channels)`; sets
            `image_size` and `channels`. Height and width may be None with
            `dynamic_image_size=True`.
        pooling: feature pooling when `include_top=False`: None (the
            `classifier`'s), `"token"`, `"avg"` (mean of patch tokens) or
            `"max"`. Ignored when `include_top=True`.
        classifier_activation: activation of the head (`"softmax"`, or None
            for logits). Defaults to `"softmax"`.
        name: str. The model's name.
        **fields: any field of `keras_vit.ViTConfig` (`patch_size`,
            `hidden_size`, `mlp_dim`, `num_heads`, `num_layers`,
            `image_size`, `classes`, `classifier`, `position_embedding`,
            `representation_size`, `drop_path_rate`, `scan_layers`, ...; see
            its documentation).

    Returns:
        A `ViTModel` (a functional `keras.Model` with `.vit_config`) from
        `(batch, height, width, channels)` images normalised as
        `keras_vit.preprocess_input(pixels, config=model.vit_config)` does
        to `(batch, classes)` scores, or `(batch, width)` features without
        the top. The encoded sequence is `model.get_layer("encoder_norm").output`.

    Example:
    >>> model = ViT(patch_size=4, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2,
    ...             image_size=16, classes=10)
    >>> model.output_shape, model.vit_config.grid_size
    ((None, 10), (4, 4))
    """
    config = resolve_config(config, fields, input_shape, input_tensor)
    include_top = _check_top(config, include_top, pooling)
    if not include_top:
        config = config.replace(classes=0)
    inputs, images = image_input(config, input_tensor)
    tokens = encode(config, *_embed(config, images))
    outputs = _pool(config, tokens, None if include_top else pooling)
    if include_top:
        outputs = _head(config, outputs, classifier_activation)
    elif isinstance(outputs, list):  # DeiT's features: the mean of its two tokens' vectors (timm's pre_logits)
        outputs = keras.layers.Average(name="distilled_features")(outputs)
    model = ViTModel(inputs, outputs, vit_config=config, name=name)
    if weights is not None:
        checkpoints.load_weights(model, weights)
    return model


def head_input(model):
    """`(tensor, name)`: the vector a keras_vit model's head reads, what the model without its top returns.

    After `pre_logits` or `projection`, else `fc_norm`, else the pooling; a distilled DeiT's,
    the mean of its two tokens' vectors. None for a model with none of these
    layers (a foreign one).
    """
    names = {layer.name for layer in model.layers}
    if "distillation_pooling" in names:
        pooled = [model.get_layer(name).output for name in ("pooling", "distillation_pooling")]
        return keras.layers.Average(name="distilled_features")(pooled), "distilled_features"
    for name in ("pre_logits", "projection", "fc_norm", "pooling", "map_head"):
        if name in names:
            return model.get_layer(name).output, name
    return None


def outputs_probabilities(model):
    """Whether a Keras classifier ends in a softmax (True) or returns logits (False).

    A softmax activation of the last layer or a `Softmax` layer counts; a
    distilled DeiT's `.keras` file written before its activation followed the
    average ends in the average of its two heads, whose activation says.
    Any other activation (a sigmoid) is refused: its outputs are neither, and
    read as logits they would be turned into wrong probabilities.
    """
    last = model.layers[-1]
    if last.name == "distilled_average":
        last = model.get_layer("head")
    activation = getattr(last, "activation", None)
    if isinstance(last, keras.layers.Softmax) or activation is keras.activations.softmax:
        return True
    if activation in (None, keras.activations.linear):
        return False
    raise ValueError(
        "A classifier must end in a softmax or return logits (classifier_activation='softmax' or None); "
        f"received the activation {getattr(activation, '__name__', activation)!r} of layer {last.name!r}"
    )


def checkpoint_stem(path):
    """A model name from a checkpoint's file name: "ViT-B_16.npz" -> "ViT-B_16"."""
    stem = os.path.basename(str(path).rstrip("/"))
    return re.sub(r"\W", "_", stem.rsplit(".", 1)[0] if "." in stem else stem)


def from_checkpoint(path, *, include_top=None, classifier_activation="softmax", name=None, **overrides):
    """Builds the model a checkpoint describes and loads it (also `keras_vit.ViT.from_checkpoint(path)`).

    Args:
        path: an official or big_vision `.npz` (official: also `gs://`,
            `https://`), a timm `.safetensors` file or model directory, a
            Hugging Face `transformers` directory, or a hub id (`org/name`,
            through `huggingface_hub`'s cache).
        include_top: bool. Defaults to True when the file has a head.
        classifier_activation: the head's activation. Defaults to "softmax".
        name: the model's name. Defaults to the file's stem.
        **overrides: `ViTConfig` fields that differ from the file's, e.g.
            `image_size=384` (position tables resized), `patch_size=8`
            (FlexiViT: the patch kernel resampled by `keras_vit.patch_resize`,
            bicubic for files with timm's numerics, else bilinear; the
            position tables resized to the new grid), `classes=10` (a new
            head at zero), `representation_size=None` (pre_logits dropped),
            `drop_path_rate=0.1`.

    Returns:
        A `ViTModel` with the checkpoint's weights.
    """
    # One read: the file's configuration and its arrays (a B/16 file is 330 MB).
    config, arrays = checkpoints.read_checkpoint(path, overrides.get("image_size"), overrides.get("num_heads"))
    if "patch_size" in overrides:
        arrays = _with_patch_size(config, arrays, overrides["patch_size"])
    model = ViT(config.replace(**overrides), include_top=include_top, classifier_activation=classifier_activation,
                name=name or checkpoint_stem(path))
    return checkpoints.load_arrays(model, arrays, str(path), overridden=tuple(overrides))


def _with_patch_size(config, arrays, patch_size):
    """`arrays` with the patch kernel resampled to `patch_size` (FlexiViT's pseudo-inverse resize)."""
    from keras_vit.checks import to_pair
    from keras_vit.patch_resize import resample_patch_kernel

    patch_size = to_pair(patch_size, "patch_size")
    if patch_size == config.patch_size:
        return arrays
    # The resize the kernel undoes: timm's (bicubic) for files in timm's numerics, else FlexiViT's (bilinear).
    method = "bicubic" if config.interpolation.startswith("bicubic") else "bilinear"
    return {**arrays, "embedding/kernel": resample_patch_kernel(arrays["embedding/kernel"], patch_size, method)}


# The model a checkpoint describes, with its weights; the checkpoints package itself imports no model.
ViT.from_checkpoint = from_checkpoint


BASE_DOCSTRING = """Builds {title}.

    {hidden_size} wide, {num_layers} blocks of {num_heads} heads, MLP {mlp_dim}
    (Dosovitskiy et al., 2021, Table 1){stem}. The `keras.applications` signature,
    plus any field of `keras_vit.ViTConfig` as a keyword (`image_size`,
    `classifier`, `representation_size`, `position_embedding`,
    `dropout_rate`, `attention_dropout_rate`, `drop_path_rate`,
    `dynamic_image_size`, ...).

    Args:
        include_top: bool. Add the classification head. Defaults to True.
        weights: None, the name of pretrained weights (e.g.
            `"augreg_in21k_ft_in1k"`, `"imagenet21k"`; see
            `keras_vit.checkpoints.pretrained.table()`), or a path or URL of an
            `.npz` or `.weights.h5` file. Named weights set the defaults of
            `image_size`, `representation_size` and `classes` to the file's.
            Defaults to None.
        input_tensor: optional Keras tensor to use as the image input.
        input_shape: optional `(height, width, channels)`.
        pooling: None, `"token"`, `"avg"` or `"max"` when
            `include_top=False`.
        classes: int. Number of classes. Defaults to the named weights',
            else 1000; another number restarts the head at zero.
        classifier_activation: head activation; None for logits. Defaults
            to `"softmax"`.
        **kwargs: any other field of `keras_vit.ViTConfig`, or `name`.

    Returns:
        A `ViTModel`; inputs are images in [-1, 1]
        (`keras_vit.preprocess_input`).

    Example (any `ViTConfig` field overrides the variant's; two blocks keep it quick):
    >>> model = keras_vit.{builder}(classes=10, image_size={example_size}, num_layers=2)
    >>> model.output_shape, model.vit_config.hidden_size
    ((None, 10), {hidden_size})
    """


def _named_builder(variant):
    """A `keras.applications`-style builder for `variant` ("B/16", "R50+B/16")."""
    config = VARIANTS[variant]
    stem, _, body = variant.rpartition("+")
    builder_name = f"{stem}_ViT_{body.replace('/', '')}".lstrip("_")

    def builder(
        include_top=True,
        weights=None,
        input_tensor=None,
        input_shape=None,
        pooling=None,
        classes=None,
        classifier_activation="softmax",
        **kwargs,
    ):
        kwargs.setdefault("name", builder_name.lower())
        resolved = None if weights is None else checkpoints.resolve_weights(weights, variant)
        if resolved is not None and resolved.entry is not None:
            entry = resolved.entry
            if input_shape is None and input_tensor is None:
                kwargs.setdefault("image_size", entry.image_size)
            kwargs.setdefault("representation_size", entry.representation_size)
            classes = entry.classes if classes is None else classes
            if include_top and classes == entry.classes and entry.zeroed_head:
                logging.warning("%s has a zeroed head: use it for features or fine-tuning", entry.name)
            weights = entry.url
        return ViT(
            config,
            include_top=include_top,
            weights=weights,
            input_tensor=input_tensor,
            input_shape=input_shape,
            pooling=pooling,
            classes=1000 if classes is None else classes,
            classifier_activation=classifier_activation,
            **kwargs,
        )

    builder.__name__ = builder.__qualname__ = builder_name
    builder.__doc__ = _builder_doc(variant, config, builder_name)
    return builder


def _builder_doc(variant, config, builder_name):
    """The docstring of a named builder: its sizes, its stem, and a runnable example."""
    stem, _, body = variant.rpartition("+")
    stem_note = ""
    if stem:
        stem_note = (f", behind a ResNet stem of {config.resnet_num_layers} units per stage "
                     f"and {config.patch_size[0]}x{config.patch_size[1]} patches on its features")
    return BASE_DOCSTRING.format(
        title=f"{stem}+ViT-{body}".lstrip("+"), stem=stem_note, builder=builder_name,
        example_size=int(body.split("/")[1]) * 4, hidden_size=config.hidden_size, num_layers=config.num_layers,
        num_heads=config.num_heads, mlp_dim=config.mlp_dim,
    )


def _deit_builder(size):
    """A builder of DeiT-`size`/16 (Touvron et al., 2021): the ViT with timm's numerics, optionally distilled."""
    base = VARIANTS[f"{size}/16"].replace(gelu_approximate=False, interpolation="bicubic",
                                          input_mean=IMAGENET_MEAN, input_std=IMAGENET_STD)
    builder_name = f"DeiT_{size}16"

    def builder(distilled=False, include_top=True, weights=None, input_tensor=None, input_shape=None,
                pooling=None, classes=1000, classifier_activation="softmax", **kwargs):
        kwargs.setdefault("name", builder_name.lower() + "_distilled" * bool(distilled))
        return ViT(base, distilled=distilled, include_top=include_top, weights=weights, input_tensor=input_tensor,
                   input_shape=input_shape, pooling=pooling, classes=classes,
                   classifier_activation=classifier_activation, **kwargs)

    builder.__name__ = builder.__qualname__ = builder_name
    builder.__doc__ = f"""Builds DeiT-{size}/16 (Touvron et al., 2021), distilled with `distilled=True`.

    The ViT-{size}/16 encoder with the conventions DeiT was trained with (timm's): exact GELU, ImageNet
    mean and std (`keras_vit.preprocess_input(x, config=model.vit_config)`), bicubic position resizing.
    `distilled=True` adds the distillation token after the class token and its head `head_dist`; the
    model's output is the activation of the two heads' mean logits (DeiT's inference rule), and each
    head is `model.get_layer("head")` / `model.get_layer("head_dist")`. `weights` takes a checkpoint path (the
    released DeiT weights in their timm / Hugging Face safetensors form). The other arguments are the
    `keras.applications` ones and any `keras_vit.ViTConfig` field.

    Example:
    >>> keras_vit.{builder_name}(distilled=True, classes=10, image_size=32).output_shape
    (None, 10)
    """
    return builder


DeiT_Ti16 = _deit_builder("Ti")
DeiT_S16 = _deit_builder("S")
DeiT_B16 = _deit_builder("B")
ViT_Ti16 = _named_builder("Ti/16")
ViT_S16 = _named_builder("S/16")
ViT_S32 = _named_builder("S/32")
ViT_B8 = _named_builder("B/8")
ViT_B16 = _named_builder("B/16")
ViT_B32 = _named_builder("B/32")
ViT_L16 = _named_builder("L/16")
ViT_L32 = _named_builder("L/32")
ViT_H14 = _named_builder("H/14")
R_ViT_Ti16 = _named_builder("R+Ti/16")
R26_ViT_S32 = _named_builder("R26+S/32")
R26_ViT_B32 = _named_builder("R26+B/32")
R50_ViT_B16 = _named_builder("R50+B/16")
R50_ViT_L32 = _named_builder("R50+L/32")
