"""`ViTConfig`: every architecture field of a ViT, told once.

The builder (`keras_vit.ViT`), the variants table, the checkpoint readers, the
trainer's recipes and the exporter all hold one of these; no other module
lists the fields. A model built by `keras_vit.ViT` carries its configuration
(`model.vit_config`, and in `model.get_config()`), so a `.keras` file knows
what it is.

The defaults are the official google-research/vision_transformer numerics.
Fields marked "timm" exist so timm / Hugging Face checkpoints load with their
own conventions (`vision_transformer.py` of timm).
"""

import dataclasses
import math
import numbers

from keras_vit.layers.utils import check_choice, to_pair

CLASSIFIERS = ("token", "gap")
POSITION_EMBEDDINGS = ("learned_1d", "learned_2d", "sincos_2d", "relative", "relative_2d", "none")
INTERPOLATIONS = ("bilinear", "bicubic")
# What `keras_vit.preprocess_input` makes of [0, 255] by default: [-1, 1].
OFFICIAL_MEAN = OFFICIAL_STD = (0.5, 0.5, 0.5)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclasses.dataclass(frozen=True)
class ViTConfig:
    """The architecture of a Vision Transformer, validated on construction.

    Example:
    >>> config = ViTConfig(patch_size=4, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2, image_size=16)
    >>> config.grid_size
    (4, 4)
    >>> config.replace(classifier="gap").class_token
    False
    """

    # --- encoder
    # Patch size in pixels (of the ResNet stem's feature map for hybrids).
    patch_size: tuple = (16, 16)
    # Token width D.
    hidden_size: int = 768
    # Hidden width of each MLP.
    mlp_dim: int = 3072
    # Attention heads per block.
    num_heads: int = 12
    # Encoder blocks.
    num_layers: int = 12
    # (height, width) the position tables are made for.
    image_size: tuple = (224, 224)
    # Input channels.
    channels: int = 3

    # --- tokens and positions
    # How the encoded sequence becomes one vector: "token" (the class token)
    # or "gap" (mean of the patch tokens).
    classifier: str = "token"
    # Whether a class token is prepended. None: exactly when classifier="token".
    # timm's global_pool="avg" models may keep one and leave it out of the mean.
    class_token: bool = None
    # DeiT's distillation token, after the class token, with its own head
    # ("head_dist"); at inference the two heads' logits are averaged (then the activation).
    distilled: bool = False
    # learned_1d, learned_2d, sincos_2d, relative, relative_2d or none.
    position_embedding: str = "learned_1d"
    # timm's `no_embed_class`: the learned_1d table covers the patches only and
    # the class token gets no position.
    no_embed_class: bool = False
    # How position tables are resampled to another grid: "bilinear"
    # (corner-aligned, official) or "bicubic" (timm's).
    interpolation: str = "bilinear"
    # Accept any resolution at call time (tables resampled in the graph).
    dynamic_image_size: bool = False

    # --- blocks
    # LayerNorm epsilon (1e-6 in the official code and timm).
    layer_norm_epsilon: float = 1e-6
    # GELU by its tanh approximation (Flax's default, the official checkpoints)
    # or exact (erf; PyTorch's default, timm's checkpoints).
    gelu_approximate: bool = True
    # Dropout after embeddings, attention and in the MLPs.
    dropout_rate: float = 0.0
    # Dropout on attention weights.
    attention_dropout_rate: float = 0.0
    # Stochastic depth of the last block; earlier blocks rise linearly from 0.
    drop_path_rate: float = 0.0
    # Hold the blocks' weights stacked in one ScannedEncoder run by a loop.
    scan_layers: bool = False
    # Recompute each block in the backward pass instead of keeping its activations (less memory in
    # training, the same gradients; inference is unchanged).
    remat: bool = False

    # --- head
    # timm's `fc_norm`: the final LayerNorm is applied to the pooled vector
    # ("fc_norm") instead of to the sequence ("encoder_norm").
    fc_norm: bool = False
    # Width of the tanh `pre_logits` layer (ImageNet-21k pre-training); None for none.
    representation_size: int = None
    # Classes of the head; 0 for a model without one (features only).
    classes: int = 1000

    # --- hybrids
    # Bottleneck units per stage of a ResNet stem in front; None for none,
    # () for the root block alone.
    resnet_num_layers: tuple = None
    # Channel multiplier of the stem.
    resnet_width_factor: float = 1.0

    # --- input
    # Per-channel mean and std, in [0, 1] pixel units, the weights expect:
    # inputs are (pixels / 255 - mean) / std (`keras_vit.preprocess_input`).
    input_mean: tuple = OFFICIAL_MEAN
    input_std: tuple = OFFICIAL_STD

    def __post_init__(self):
        fix = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 (frozen)
        fix("patch_size", to_pair(self.patch_size, "patch_size"))
        fix("image_size", to_pair(self.image_size, "image_size"))
        for name in ("hidden_size", "mlp_dim", "num_heads", "num_layers", "channels"):
            _check_int(name, getattr(self, name), low=1)
        _check_int("classes", self.classes, low=0)
        if self.representation_size is not None:
            _check_int("representation_size", self.representation_size, low=1)
        check_choice(self.classifier, CLASSIFIERS, "classifier")
        check_choice(self.position_embedding, POSITION_EMBEDDINGS, "position_embedding")
        check_choice(self.interpolation, INTERPOLATIONS, "interpolation")
        if self.class_token is None:
            fix("class_token", self.classifier == "token")
        for name in ("class_token", "distilled", "no_embed_class", "dynamic_image_size", "gelu_approximate",
                     "scan_layers", "remat", "fc_norm"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"`{name}` must be a bool; received {name}={getattr(self, name)!r}")
        for name, high in (("dropout_rate", 1), ("attention_dropout_rate", 1), ("drop_path_rate", 1)):
            _check_float(name, getattr(self, name), 0.0, high)
        _check_float("layer_norm_epsilon", self.layer_norm_epsilon, 0.0, None, low_open=True)
        _check_float("resnet_width_factor", self.resnet_width_factor, 0.0, None, low_open=True)
        if self.resnet_num_layers is not None:
            fix("resnet_num_layers", tuple(self.resnet_num_layers))
            for units in self.resnet_num_layers:
                _check_int("resnet_num_layers", units, low=1)
        for name in ("input_mean", "input_std"):
            value = tuple(float(v) for v in getattr(self, name))
            if (len(value) != self.channels or not all(map(math.isfinite, value))
                    or (name == "input_std" and min(value) <= 0)):
                raise ValueError(f"`{name}` must hold {self.channels} finite floats (one per channel)"
                                 f"{', each > 0' if name == 'input_std' else ''}; received {name}={getattr(self, name)!r}")
            fix(name, value)
        self._check_combinations()

    def _check_combinations(self):
        if self.hidden_size % self.num_heads:
            raise ValueError(f"`hidden_size` must be divisible by `num_heads`; received "
                             f"hidden_size={self.hidden_size}, num_heads={self.num_heads}")
        if self.classifier == "token" and not self.class_token:
            raise ValueError("classifier='token' pools the class token; received class_token=False")
        if self.distilled and (self.classifier != "token" or self.representation_size or self.fc_norm):
            raise ValueError("distilled=True (DeiT) reads a class token and a distillation token, each by its own "
                             f"head; received classifier={self.classifier!r}, representation_size="
                             f"{self.representation_size}, fc_norm={self.fc_norm}")
        if self.no_embed_class and self.position_embedding != "learned_1d":
            raise ValueError("`no_embed_class` is a property of learned_1d tables; received "
                             f"position_embedding={self.position_embedding!r}")
        if self.dynamic_image_size and self.position_embedding == "relative_2d":
            raise ValueError("position_embedding='relative_2d' needs a fixed grid; received dynamic_image_size=True. "
                             "Use 'relative' or build one model per resolution.")
        stochastic = (self.dropout_rate, self.attention_dropout_rate, self.drop_path_rate)
        if self.remat and self.scan_layers and any(stochastic):
            # Restoring the dropout seeds for the recomputation (EncoderBlock) assigns variables, which
            # TensorFlow cannot differentiate inside the scan's loop.
            raise ValueError("remat=True with scan_layers=True needs dropout_rate, attention_dropout_rate and "
                             f"drop_path_rate at 0; received {stochastic}. Use scan_layers=False with remat")
        token = self.token_size
        if self.image_size[0] % token[0] or self.image_size[1] % token[1]:
            what = f"`patch_size`={self.patch_size}"
            if token != self.patch_size:
                what += f" times the ResNet stride {token[0] // self.patch_size[0]}"
            raise ValueError(f"`image_size` must be divisible by {what}; received image_size={self.image_size}")

    @property
    def token_size(self):
        """Pixels per token: the patch, times the stem's output stride for hybrids."""
        from keras_vit.layers.resnet_stem import output_stride

        stride = 1 if self.resnet_num_layers is None else output_stride(self.resnet_num_layers)
        return (self.patch_size[0] * stride, self.patch_size[1] * stride)

    @property
    def grid_size(self):
        """(rows, cols) of the patch grid at `image_size`."""
        return tuple(size // token for size, token in zip(self.image_size, self.token_size))

    @property
    def num_prefix_tokens(self):
        return int(self.class_token) + int(self.distilled)

    def replace(self, **changes):
        """A copy with `changes`; unknown names raise a TypeError naming them."""
        unknown = sorted(set(changes) - set(FIELDS))
        if unknown:
            raise TypeError(f"ViTConfig has no field(s) {unknown}; its fields are {sorted(FIELDS)}")
        if "classifier" in changes and "class_token" not in changes:
            changes["class_token"] = None  # follow the new classifier
        return dataclasses.replace(self, **changes)

    def to_dict(self):
        """JSON-ready fields (tuples as lists)."""
        return {name: list(value) if isinstance(value, tuple) else value
                for name, value in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, fields):
        """The inverse of `to_dict`; unknown keys raise naming them."""
        unknown = sorted(set(fields) - set(FIELDS))
        if unknown:
            raise ValueError(f"Unknown ViTConfig field(s) {unknown}; its fields are {sorted(FIELDS)}")
        return cls(**fields)


FIELDS = {field.name: field for field in dataclasses.fields(ViTConfig)}
# (height, width) fields, one int for a square; per-channel float fields.
PAIRS = ("patch_size", "image_size")
PER_CHANNEL = ("input_mean", "input_std")
# Fields that decide what given weights compute, beyond their shapes: a checkpoint and a model it
# starts must agree on them (`differing_conventions`).
CONVENTION_FIELDS = ("classifier", "class_token", "distilled", "no_embed_class", "position_embedding",
                     "gelu_approximate", "fc_norm", "layer_norm_epsilon", "input_mean", "input_std")
# Fields a dataset decides for a training run.
DATA_FIELDS = ("classes", "channels")
# Fields that shape training only: the same weights compute the same function whatever they are.
TRAINING_FIELDS = ("dropout_rate", "attention_dropout_rate", "drop_path_rate", "scan_layers", "remat")


def differing_conventions(config, other):
    """The `CONVENTION_FIELDS` on which two configs differ.

    A per-channel value that is one number for every channel equals it for any channel count.
    """
    def same(mine, theirs):
        return mine == theirs or (isinstance(mine, tuple) and isinstance(theirs, tuple) and len({*mine, *theirs}) == 1)

    return [name for name in CONVENTION_FIELDS if not same(getattr(config, name), getattr(other, name))]


def _check_int(name, value, low):
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < low:
        raise ValueError(f"`{name}` must be an int >= {low}; received {name}={value!r}")


def _check_float(name, value, low, high, low_open=False):
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low) and (high is None or value < high)
    if not ok:
        bounds = f"{'(' if low_open else '['}{low}, {'inf)' if high is None else f'{high})'}"
        raise ValueError(f"`{name}` must be a float in {bounds}; received {name}={value!r}")
