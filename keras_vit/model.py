"""`ViT(...)` and the named builders `ViT_B16()`, `ViT_L16()`, ...

The model of Dosovitskiy et al., "An Image is Worth 16x16 Words" (ICLR
2021), following google-research/vision_transformer (`models_vit.py`) so its
checkpoints load one to one, with the `keras.applications` signature.

    image -> [ResNetStem] -> PatchEmbedding -> [ClassToken] -> PositionEmbedding -> Dropout
          -> EncoderBlock x num_layers (or one ScannedEncoder) -> LayerNorm ("encoder_norm")
          -> SequencePooling -> [Dense tanh "pre_logits"] -> Dense "head"
"""

import logging

import keras

from keras_vit import checkpoints, pretrained
from keras_vit import layers as vit_layers
from keras_vit.layers.drop_path import linear_rate
from keras_vit.layers.resnet_stem import output_stride
from keras_vit.layers.utils import check_choice, to_pair
from keras_vit.variants import decode_variant

CLASSIFIERS = ("token", "gap")
POSITION_EMBEDDINGS = ("learned_1d", "learned_2d", "sincos_2d", "relative", "relative_2d", "none")
POOLINGS = (None, "token", "avg", "max")
DEFAULT_IMAGE_SIZE = 224


def _resolve_input_shape(image_size, input_shape, input_tensor, dynamic_image_size):
    """Returns `(image_size, input_shape)`: the grid's pixel size and the Input's shape."""
    if input_shape is None and input_tensor is not None:
        input_shape = tuple(input_tensor.shape[1:])
    if input_shape is not None:
        input_shape = tuple(input_shape)
        if len(input_shape) != 3:
            raise ValueError(
                "`input_shape` must be (height, width, channels); "
                f"received input_shape={input_shape}"
            )
    channels = 3 if input_shape is None else input_shape[2]
    spatial = None if input_shape is None else input_shape[:2]
    if spatial is not None and None not in spatial:
        if image_size is not None and to_pair(image_size, "image_size") != spatial:
            raise ValueError(
                "`image_size` and `input_shape` disagree: "
                f"received image_size={image_size} and input_shape={input_shape}"
            )
        image_size = spatial
    elif spatial is not None and not dynamic_image_size:
        raise ValueError(
            "An input of unknown height or width needs dynamic_image_size=True; "
            f"received input_shape={input_shape}"
        )
    image_size = to_pair(DEFAULT_IMAGE_SIZE if image_size is None else image_size, "image_size")
    if dynamic_image_size:
        return image_size, (None, None, channels)
    return image_size, (*image_size, channels)


def ViT(
    *,
    patch_size,
    hidden_size,
    mlp_dim,
    num_heads,
    num_layers,
    image_size=None,
    include_top=True,
    weights=None,
    input_tensor=None,
    input_shape=None,
    pooling=None,
    classes=1000,
    classifier_activation="softmax",
    classifier="token",
    representation_size=None,
    position_embedding="learned_1d",
    dropout_rate=0.0,
    attention_dropout_rate=0.0,
    drop_path_rate=0.0,
    layer_norm_epsilon=1e-6,
    dynamic_image_size=False,
    interpolation="bilinear",
    resnet_num_layers=None,
    resnet_width_factor=1.0,
    scan_layers=False,
    name="vit",
):
    """Builds a Vision Transformer with every field given explicitly.

    Args:
        patch_size: int or (int, int). Patch size in pixels.
        hidden_size: int. Token width D.
        mlp_dim: int. Hidden width of each MLP.
        num_heads: int. Attention heads per block.
        num_layers: int. Encoder blocks.
        image_size: int or (height, width). Resolution the position tables
            are made for. Defaults to `input_shape`'s, else 224.
        include_top: bool. Whether to add the classification head; without
            it the model returns the pooled features. Defaults to True.
        weights: None; the path or URL of an official `.npz` checkpoint
            (local, `gs://`, or `https://`, downloaded once into the Keras
            cache; position tables are resized to `image_size` and a head
            for other `classes` restarts at zero); or a Keras weights file
            (`*.weights.h5`). Named weights go through the named builders.
            Defaults to None.
        input_tensor: optional Keras tensor (output of `keras.Input`) to
            use as the image input.
        input_shape: optional `(height, width, channels)`; height and width
            may be None with `dynamic_image_size=True`.
        pooling: feature pooling when `include_top=False`: None (the
            `classifier`'s), `"token"`, `"avg"` (mean of patch tokens) or
            `"max"`. Ignored when `include_top=True`.
        classes: int. Number of classes of the head. Defaults to 1000.
        classifier_activation: activation of the head (`"softmax"`, or None
            for logits). Defaults to `"softmax"`.
        classifier: `"token"` (class token) or `"gap"` (global average
            pooling, no class token). Defaults to `"token"`.
        representation_size: optional int. Width of the tanh `pre_logits`
            layer before the head (the ImageNet-21k pre-training models).
        position_embedding: one of `"learned_1d"`, `"learned_2d"`,
            `"sincos_2d"`, `"relative"`, `"relative_2d"`, `"none"`.
            Defaults to `"learned_1d"`.
        dropout_rate: float. Dropout after the embeddings, attention and in
            the MLPs. Defaults to 0.
        attention_dropout_rate: float. Dropout on attention weights.
            Defaults to 0.
        drop_path_rate: float. Stochastic depth of the last block; earlier
            blocks rise linearly from 0 (DeiT's schedule). Defaults to 0.
        layer_norm_epsilon: float. Defaults to 1e-6, the official value.
        dynamic_image_size: bool. Accept any resolution at call time; the
            position embeddings are resampled in the graph. Defaults to False.
        interpolation: `"bilinear"` (corner-aligned, official) or
            `"bicubic"` (timm's): how position tables are resampled.
        resnet_num_layers: None, or the bottleneck units per stage of a
            ResNet stem that makes a hybrid (e.g. (3, 4, 9) for R50);
            `()` is the root block alone. Defaults to None (no stem).
        resnet_width_factor: float. Channel multiplier of the stem.
            Defaults to 1.
        scan_layers: bool. Hold the encoder blocks' weights stacked in one
            `ScannedEncoder` layer ("encoder") run by a loop, instead of
            `encoder_block_0`, ...: the same function and checkpoints,
            compiled by XLA in a quarter to half the time, but training
            steps ~16% slower on CPU (BUILD.md).
            Defaults to False.
        name: str. The model's name.

    Returns:
        A `keras.Model` from `(batch, height, width, channels)` images in
        [-1, 1] (see `keras_vit.preprocess_input`) to `(batch, classes)`
        scores, or `(batch, width)` features without the top. The encoded
        token sequence is `model.get_layer("encoder_norm").output`.
    """
    check_choice(classifier, CLASSIFIERS, "classifier")
    check_choice(position_embedding, POSITION_EMBEDDINGS, "position_embedding")
    check_choice(pooling, POOLINGS, "pooling")
    if pooling == "token" and classifier != "token":
        raise ValueError(
            "pooling='token' needs a class token (classifier='token'); "
            f"received classifier={classifier!r}"
        )
    if include_top and (not isinstance(classes, int) or classes < 1):
        raise ValueError(f"`classes` must be a positive int; received classes={classes!r}")
    if dynamic_image_size and position_embedding == "relative_2d":
        raise ValueError(
            "position_embedding='relative_2d' needs a fixed grid; received dynamic_image_size=True. "
            "Use 'relative' or build one model per resolution."
        )
    patch_size = to_pair(patch_size, "patch_size")
    image_size, input_shape = _resolve_input_shape(
        image_size, input_shape, input_tensor, dynamic_image_size
    )
    # Pixels per token: the patch, times the stem's output stride for hybrids.
    stride = 1 if resnet_num_layers is None else output_stride(resnet_num_layers)
    token_size = (patch_size[0] * stride, patch_size[1] * stride)
    if image_size[0] % token_size[0] or image_size[1] % token_size[1]:
        what = f"`patch_size`={patch_size}" + (f" times the ResNet stride {stride}" if stride > 1 else "")
        raise ValueError(
            f"`image_size` must be divisible by {what}; received image_size={image_size}"
        )
    grid_size = (image_size[0] // token_size[0], image_size[1] // token_size[1])

    if input_tensor is None:
        images = inputs = keras.Input(shape=input_shape, name="images")
    elif keras.backend.is_keras_tensor(input_tensor):
        # As keras.applications: the model starts at the tensor's own Input(s).
        images, inputs = input_tensor, keras.utils.get_source_inputs(input_tensor)
        inputs = inputs[0] if len(inputs) == 1 else inputs
    else:
        images = inputs = keras.Input(tensor=input_tensor, shape=input_shape, name="images")

    num_prefix_tokens = 1 if classifier == "token" else 0
    relative = position_embedding if position_embedding.startswith("relative") else None
    features = images
    if resnet_num_layers is not None:
        features = vit_layers.ResNetStem(resnet_num_layers, resnet_width_factor, name="resnet_stem")(images)
    patches = vit_layers.PatchEmbedding(patch_size, hidden_size, name="patch_embedding")(features)
    prefix = vit_layers.ClassToken(name="class_token")(patches) if num_prefix_tokens else None
    tokens = vit_layers.PositionEmbedding(
        "none" if relative else position_embedding,
        grid_size=grid_size,
        num_prefix_tokens=num_prefix_tokens,
        interpolation=interpolation,
        name="position_embedding",
    )(patches, prefix_tokens=prefix)
    tokens = keras.layers.Dropout(dropout_rate, name="embedding_dropout")(tokens)
    block_config = dict(
        num_heads=num_heads,
        mlp_dim=mlp_dim,
        dropout_rate=dropout_rate,
        attention_dropout_rate=attention_dropout_rate,
        layer_norm_epsilon=layer_norm_epsilon,
        relative_position=relative,
        grid_size=grid_size if relative else None,
        num_prefix_tokens=num_prefix_tokens,
        interpolation=interpolation,
    )
    if scan_layers:
        block_config["drop_path_rate"] = drop_path_rate  # the last block's: each block gets its linear_rate
        tokens = vit_layers.ScannedEncoder(num_layers, block_config, name="encoder")(tokens)
    else:
        for i in range(num_layers):
            tokens = vit_layers.EncoderBlock(
                **block_config,
                drop_path_rate=linear_rate(drop_path_rate, i, num_layers),
                name=f"encoder_block_{i}",
            )(tokens)
    tokens = keras.layers.LayerNormalization(epsilon=layer_norm_epsilon, name="encoder_norm")(tokens)

    if include_top or pooling is None:
        mode = classifier
    else:
        mode = {"token": "token", "avg": "gap", "max": "max"}[pooling]
    outputs = vit_layers.SequencePooling(mode, num_prefix_tokens, name="pooling")(tokens)
    if representation_size:
        outputs = keras.layers.Dense(representation_size, activation="tanh", name="pre_logits")(outputs)
    if include_top:
        # The head starts at zero (the paper's fine-tuning rule) and computes
        # in the variable dtype, so logits are float32 under mixed precision.
        outputs = keras.layers.Dense(
            classes,
            activation=classifier_activation,
            kernel_initializer="zeros",
            bias_initializer="zeros",
            dtype=keras.mixed_precision.dtype_policy().variable_dtype,
            name="head",
        )(outputs)
    model = keras.Model(inputs, outputs, name=name)
    if weights is not None:
        load_weights(model, weights)
    return model


def load_weights(model, weights):
    """Loads `weights` into `model`: an `.npz` path or URL, or `*.weights.h5`."""
    path = str(weights)
    if path.endswith(".weights.h5"):
        model.load_weights(path)
    elif path.endswith(".npz"):
        if path.startswith(("http://", "https://")):
            path = pretrained.fetch(path)
        checkpoints.load_npz(model, path)
    else:
        raise ValueError(
            "`weights` must be None, the path or URL of an official '.npz' checkpoint, a Keras "
            "'.weights.h5' file, or (in a named builder such as ViT_B16) the name of pretrained "
            f"weights; received weights={weights!r}"
        )


BASE_DOCSTRING = """Builds {title}.

    {hidden_size} wide, {num_layers} blocks of {num_heads} heads, MLP {mlp_dim}
    (Dosovitskiy et al., 2021, Table 1){stem}. The `keras.applications` signature,
    plus any field of `keras_vit.ViT` as a keyword (`image_size`,
    `classifier`, `representation_size`, `position_embedding`,
    `dropout_rate`, `attention_dropout_rate`, `drop_path_rate`,
    `dynamic_image_size`, ...).

    Args:
        include_top: bool. Add the classification head. Defaults to True.
        weights: None, the name of pretrained weights (e.g.
            `"augreg_in21k_ft_in1k"`, `"imagenet21k"`; see
            `keras_vit.pretrained.table()`), or a path or URL of an `.npz`
            or `.weights.h5` file. Named weights set the defaults of
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
        **kwargs: any other field of `keras_vit.ViT`.

    Returns:
        A `keras.Model`; inputs are images in [-1, 1]
        (`keras_vit.preprocess_input`).

    Example:
    >>> model = keras_vit.{builder}(classes=10, image_size={example_size})
    >>> model.output_shape
    (None, 10)
    """


def _named_builder(variant):
    """A `keras.applications`-style builder for `variant` ("B/16", "R50+B/16")."""
    fields = decode_variant(variant)
    stem, _, body = variant.rpartition("+")
    size, stride = body.split("/")
    builder_name = f"{stem}_ViT_{size}{stride}".lstrip("_")

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
        if weights is not None and not str(weights).endswith((".npz", ".weights.h5")):
            entry = pretrained.resolve(variant, weights)
            if input_shape is None and input_tensor is None:
                kwargs.setdefault("image_size", entry.image_size)
            kwargs.setdefault("representation_size", entry.representation_size)
            classes = entry.classes if classes is None else classes
            if include_top and classes == entry.classes and entry.zeroed_head:
                logging.warning("%s has a zeroed head: use it for features or fine-tuning", entry.name)
            weights = entry.url
        return ViT(
            **fields,
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
    stem_note = ""
    if stem:
        stem_note = (f", behind a ResNet stem of {fields['resnet_num_layers']} units per stage "
                     f"and {fields['patch_size']}x{fields['patch_size']} patches on its features")
    builder.__doc__ = BASE_DOCSTRING.format(
        title=f"{stem}+ViT-{body}".lstrip("+"), stem=stem_note, builder=builder_name,
        example_size=int(stride) * 4, **fields
    )
    return builder


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
