"""`ViTConfig`: every architecture field of a ViT, told once.

The builder (`keras_vit.ViT`), the variants table, the checkpoint readers, the
trainer's recipes and the exporter all hold one of these; no other module
lists the fields. A model built by `keras_vit.ViT` carries its configuration
(`model.vit_config`, and in `model.get_config()`), so a `.keras` file knows
what it is.

The defaults are the official google-research/vision_transformer numerics.
Fields marked "timm" exist so timm / Hugging Face checkpoints load with their
own conventions (`vision_transformer.py` of timm).

Each field declares its help and its role once, in its metadata: the role
tuples below (`CONVENTION_FIELDS`, ...), the checks in `__post_init__` and the
trainer's flag help are read from there. This module imports neither Keras nor
TensorFlow, so a command line can check a configuration before either starts.
"""

import dataclasses
import math

from keras_vit.checks import check_bool, check_choice, check_count, check_float, to_pair

# token_and_gap: DINOv2's classifier input, concat(class token, mean of the patch tokens).
CLASSIFIERS = ("token", "gap", "map", "token_and_gap")
POSITION_EMBEDDINGS = ("learned_1d", "learned_2d", "sincos_2d", "relative", "relative_2d", "none")
# Rotary position embeddings (keras_vit/positions/rotary.py), turning queries and keys in every block.
ROTARY_EMBEDDINGS = ("rope_axial", "rope_mixed", "rope_eva", "rope_dinov3")
INTERPOLATIONS = ("bilinear", "bicubic", "bicubic_no_antialias")
# The MLP's activation: GELU (in the form `gelu_approximate` says), CLIP's QuickGELU, x * sigmoid(1.702 x), or
# SiLU, x * sigmoid(x) (SwiGLU's gate, with gated_mlp).
ACTIVATIONS = ("gelu", "quick_gelu", "silu")
# The model's norm layer: LayerNorm, or RMSNorm (x / sqrt(mean(x^2) + eps) * scale, no bias; AIMv2).
NORM_LAYERS = ("layer_norm", "rms_norm")
# The classifiers that read the class token.
TOKEN_CLASSIFIERS = ("token", "token_and_gap")
# Which of query, key and value projections have a bias: all (official), none, or q and v (EVA/BEiT: k's is zero).
QKV_BIASES = ("all", "none", "qv")
# What `keras_vit.preprocess_input` makes of [0, 255] by default: [-1, 1].
OFFICIAL_MEAN = OFFICIAL_STD = (0.5, 0.5, 0.5)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# OpenAI CLIP's (open_clip's OPENAI_DATASET_MEAN / STD), which CLIP's and AIMv2's files state.
OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

# The roles of the fields.
ARCHITECTURE = "architecture"  # the shapes of the weights
CONVENTION = "convention"  # what given weights compute, beyond their shapes
RESOLUTION = "resolution"  # the input grid; the same weights serve another one (tables resampled)
TRAINING = "training"  # training only: the same weights compute the same function whatever they are
DATA = "data"  # what the dataset of a training run decides
ROLES = (ARCHITECTURE, CONVENTION, RESOLUTION, TRAINING, DATA)
# The forms of tuple fields: (height, width), one int for a square; one float per channel; ints.
PAIR, PER_CHANNEL_FORM, INTS = "pair", "per_channel", "ints"


def _field(default, role, help_text, *, form=None, choices=None, low=None, high=None, low_open=False, optional=False):
    """A ViTConfig field: its default, role (one of ROLES), help, and what `__post_init__` accepts.

    form: PAIR, PER_CHANNEL_FORM or INTS for tuples; choices: the accepted strings; low, high, low_open: the
    numeric bounds ([low, high), (low, high) when low_open); optional: None is accepted (means "none").
    """
    if role not in ROLES:
        raise ValueError(f"`role` must be one of {ROLES}; received role={role!r}")
    metadata = {"help": help_text, "role": role, "form": form, "choices": choices, "low": low, "high": high,
                "low_open": low_open, "optional": optional}
    return dataclasses.field(default=default, metadata=metadata)


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
    patch_size: tuple = _field((16, 16), ARCHITECTURE, "Patch size in pixels (of the ResNet stem's feature map for "
                               "hybrids); one int for a square.", form=PAIR)
    hidden_size: int = _field(768, ARCHITECTURE, "Token width D.", low=1)
    mlp_dim: int = _field(3072, ARCHITECTURE, "Hidden width of each MLP.", low=1)
    num_heads: int = _field(12, ARCHITECTURE, "Attention heads per block.", low=1)
    num_layers: int = _field(12, ARCHITECTURE, "Encoder blocks.", low=1)
    image_size: tuple = _field((224, 224), RESOLUTION, "(height, width) the position tables are made for; one int "
                               "for a square.", form=PAIR)
    channels: int = _field(3, DATA, "Input channels.", low=1)

    # --- tokens and positions
    classifier: str = _field("token", CONVENTION, "How the encoded sequence becomes one vector: 'token' (the class "
                             "token), 'gap' (mean of the patch tokens), 'map' (a learned probe's attention over the "
                             "patch tokens: big_vision's MAP head) or 'token_and_gap' (the class token and the mean "
                             "of the patch tokens side by side, 2 x hidden_size: DINOv2's classifier).",
                             choices=CLASSIFIERS)
    # timm's global_pool="avg" models may keep a class token and leave it out of the mean.
    class_token: bool = _field(None, CONVENTION, "Whether a class token is prepended; None: exactly when "
                               "the classifier reads one ('token', 'token_and_gap').")
    distilled: bool = _field(False, CONVENTION, "DeiT's distillation token, after the class token, with its own "
                             "head ('head_dist'); at inference the two heads' logits are averaged (then the "
                             "activation).")
    num_register_tokens: int = _field(0, ARCHITECTURE, "Register tokens (timm's `reg_tokens`): learned prefix "
                                      "tokens after the class token, left out of pooling; they get a position "
                                      "exactly when the class token does (no_embed_class).", low=0)
    position_embedding: str = _field("learned_1d", CONVENTION, "Position embedding: " + ", ".join(POSITION_EMBEDDINGS)
                                     + ".", choices=POSITION_EMBEDDINGS)
    no_embed_class: bool = _field(False, CONVENTION, "timm's `no_embed_class`: the learned_1d table covers the "
                                  "patches only and the class token gets no position.")
    rotary_embedding: str = _field(None, CONVENTION, "Rotary positions on each block's queries and keys, beside "
                                   "position_embedding or alone: 'rope_axial' (RoPE-ViT: patch indices), "
                                   "'rope_mixed' (RoPE-Mixed: learned frequencies per head and block), 'rope_eva' "
                                   "(EVA02: indices rescaled onto rope_reference_grid) or 'rope_dinov3' (patch "
                                   "centres in (-1, 1)); prefix tokens are left unturned.", choices=ROTARY_EMBEDDINGS,
                                   optional=True)
    rope_theta: float = _field(None, CONVENTION, "The rotary frequencies' base (None: the kind's own, 100 for "
                               "rope_axial and rope_dinov3, 10000 for rope_eva, 10 for rope_mixed's initial ones).",
                               low=1.0, low_open=True, optional=True)
    rope_reference_grid: tuple = _field(None, CONVENTION, "rope_eva's grid (rows, cols) every grid's indices are "
                                        "rescaled onto (EVA02's 16 x 16 pretraining grid); None: the grid at "
                                        "image_size, fixed when the config is made.", form=PAIR, optional=True)
    interpolation: str = _field("bilinear", RESOLUTION, "How position tables are resampled to another grid: "
                                "'bilinear' (corner-aligned, official), 'bicubic' (timm's, antialiased) or "
                                "'bicubic_no_antialias' (transformers').", choices=INTERPOLATIONS)
    dynamic_image_size: bool = _field(False, RESOLUTION, "Accept any resolution at call time (tables resampled in "
                                      "the graph).")
    patch_bias: bool = _field(True, ARCHITECTURE, "Whether the patch projection has a bias (CLIP's has none).")
    norm_pre: bool = _field(False, ARCHITECTURE, "A norm on the token sequence after the positions and before "
                            "the first block (timm's norm_pre, CLIP's ln_pre).")
    patch_norm: bool = _field(False, ARCHITECTURE, "A norm on each patch embedding, before the positions are added "
                              "(timm's patch_embed.norm; AIMv2).")

    # --- blocks
    norm_layer: str = _field("layer_norm", ARCHITECTURE, "Every norm of the model: 'layer_norm' or 'rms_norm' "
                             "(x / sqrt(mean(x^2) + eps) * scale, no bias or mean; timm's norm_layer='rmsnorm', "
                             "AIMv2).", choices=NORM_LAYERS)
    layer_norm_epsilon: float = _field(1e-6, CONVENTION, "The norms' epsilon (1e-6 in the official code and timm, "
                                       "1e-5 in CLIP).", low=0.0, low_open=True)
    gelu_approximate: bool = _field(True, CONVENTION, "GELU by its tanh approximation (Flax's default, the official "
                                    "checkpoints) or exact (erf; PyTorch's default, timm's checkpoints); held False "
                                    "with another activation, which has no GELU.")
    # A field beside gelu_approximate, not a third value of it (nor a choice it follows): older configs and files,
    # and an override of gelu_approximate alone (from_checkpoint's, the trainer's flag), keep their one meaning.
    activation: str = _field("gelu", CONVENTION, "The MLP's activation: 'gelu' (in the form gelu_approximate says), "
                             "'quick_gelu' (CLIP's x * sigmoid(1.702 x), timm's act_layer='quick_gelu') or 'silu' "
                             "(x * sigmoid(x); SwiGLU with gated_mlp).", choices=ACTIVATIONS)
    gated_mlp: bool = _field(False, ARCHITECTURE, "A gated MLP (GLU): the first projection gives 2 x mlp_dim, a gate "
                             "and a value, and the activation of the gate times the value goes on (SwiGLU with "
                             "activation='silu': DINOv2 giant, AIMv2).")
    qkv_bias: str = _field("all", ARCHITECTURE, "Which attention projections have a bias: 'all' (official), 'none', "
                           "or 'qv' (EVA/BEiT: query and value; the key's is a fixed zero).", choices=QKV_BIASES)
    attention_norm: bool = _field(False, ARCHITECTURE, "A norm on the attention's heads, concatenated, before its "
                                  "output projection (timm's scale_attn_inner; EVA02-CLIP).")
    mlp_norm: bool = _field(False, ARCHITECTURE, "A norm on the MLP's hidden units before its second projection "
                            "(timm's scale_mlp, EVA02's sub-LN).")
    qk_norm: bool = _field(False, ARCHITECTURE, "A norm on each head's queries and keys before their dot products "
                           "(timm's qk_norm), one per projection, shared by the heads.")
    layer_scale_init: float = _field(None, ARCHITECTURE, "LayerScale (timm's init_values; DeiT III, DINOv2): each "
                                     "residual branch multiplied by a learned per-channel scale starting at this "
                                     "value; None for none.", low=0.0, low_open=True, optional=True)
    dropout_rate: float = _field(0.0, TRAINING, "Dropout after embeddings, attention and in the MLPs.",
                                 low=0.0, high=1)
    attention_dropout_rate: float = _field(0.0, TRAINING, "Dropout on attention weights.", low=0.0, high=1)
    drop_path_rate: float = _field(0.0, TRAINING, "Stochastic depth of the last block; earlier blocks rise "
                                   "linearly from 0.", low=0.0, high=1)
    scan_layers: bool = _field(False, TRAINING, "Hold the blocks' weights stacked in one ScannedEncoder run by a "
                               "loop.")
    remat: bool = _field(False, TRAINING, "Recompute each block in the backward pass instead of keeping its "
                         "activations (less memory in training, the same gradients; inference is unchanged).")
    patch_dropout: float = _field(0.0, TRAINING, "PatchDropout (Liu et al., 2023): in training each image keeps a "
                                  "random max(1, int(N (1 - rate))) of its N patch tokens, in their order, and every "
                                  "prefix token, so the blocks see fewer tokens; inference is unchanged.",
                                  low=0.0, high=1)

    # --- head
    fc_norm: bool = _field(False, CONVENTION, "timm's `fc_norm`: the final LayerNorm is applied to the pooled "
                           "vector ('fc_norm') instead of to the sequence ('encoder_norm').")
    representation_size: int = _field(None, ARCHITECTURE, "Width of the tanh `pre_logits` layer (ImageNet-21k "
                                      "pre-training); None (the trainer's 0) for none.", low=1, optional=True)
    projection_dim: int = _field(None, ARCHITECTURE, "Width of a linear projection without bias of the pooled vector "
                                 "(CLIP's visual_projection: the image embedding); None for none.", low=1,
                                 optional=True)
    classes: int = _field(1000, DATA, "Classes of the head; 0 for a model without one (features only).", low=0)

    # --- hybrids
    resnet_num_layers: tuple = _field(None, ARCHITECTURE, "Bottleneck units per stage of a ResNet stem in front "
                                      "(comma-separated); None for none, () for the root block alone.",
                                      form=INTS, low=1, optional=True)
    resnet_width_factor: float = _field(1.0, ARCHITECTURE, "Channel multiplier of the ResNet stem.",
                                        low=0.0, low_open=True)

    # --- input
    input_mean: tuple = _field(OFFICIAL_MEAN, CONVENTION, "Per-channel mean, in [0, 1] pixel units, the weights "
                               "expect: inputs are (pixels / 255 - mean) / std (keras_vit.preprocess_input).",
                               form=PER_CHANNEL_FORM)
    input_std: tuple = _field(OFFICIAL_STD, CONVENTION, "Per-channel standard deviation, in [0, 1] pixel units, the "
                              "weights expect (see input_mean).", form=PER_CHANNEL_FORM)

    def __post_init__(self):
        if self.class_token is None:
            object.__setattr__(self, "class_token", self.classifier in TOKEN_CLASSIFIERS)
        for field in dataclasses.fields(self):
            object.__setattr__(self, field.name, _checked(field, getattr(self, field.name), self.channels))
        if self.rotary_embedding == "rope_eva" and self.rope_reference_grid is None:  # as image_size changes, kept
            object.__setattr__(self, "rope_reference_grid", self.grid_size)
        if self.activation != "gelu":  # one config per function: a QuickGELU or SiLU model's configs compare equal
            object.__setattr__(self, "gelu_approximate", False)
        self._check_combinations()

    def _check_combinations(self):
        if self.hidden_size % self.num_heads:
            raise ValueError(f"`hidden_size` must be divisible by `num_heads`; received "
                             f"hidden_size={self.hidden_size}, num_heads={self.num_heads}")
        if self.classifier in TOKEN_CLASSIFIERS and not self.class_token:
            raise ValueError(f"classifier={self.classifier!r} pools the class token; received class_token=False")
        if self.distilled and (self.classifier != "token" or self.representation_size or self.fc_norm
                               or self.projection_dim):
            raise ValueError("distilled=True (DeiT) reads a class token and a distillation token, each by its own "
                             f"head; received classifier={self.classifier!r}, representation_size="
                             f"{self.representation_size}, fc_norm={self.fc_norm}, "
                             f"projection_dim={self.projection_dim}")
        if self.projection_dim and self.representation_size:
            raise ValueError("projection_dim (CLIP's linear projection) and representation_size (a tanh pre_logits "
                             "layer) are two ends of the pooled vector: a model has one; received projection_dim="
                             f"{self.projection_dim}, representation_size={self.representation_size}")
        if self.distilled and self.num_register_tokens:
            raise ValueError("distilled=True (DeiT) has no register tokens (timm's DeiT neither); received "
                             f"num_register_tokens={self.num_register_tokens}")
        if self.no_embed_class and self.position_embedding != "learned_1d":
            raise ValueError("`no_embed_class` is a property of learned_1d tables; received "
                             f"position_embedding={self.position_embedding!r}")
        if self.rotary_embedding is None and (self.rope_theta, self.rope_reference_grid) != (None, None):
            raise ValueError("rope_theta and rope_reference_grid set rotary positions; received rotary_embedding="
                             f"None with rope_theta={self.rope_theta}, rope_reference_grid={self.rope_reference_grid}")
        if self.rotary_embedding is not None:
            if (self.hidden_size // self.num_heads) % 4:
                raise ValueError(f"rotary_embedding={self.rotary_embedding!r} turns head_dim / 4 channel pairs per "
                                 "axis: hidden_size / num_heads must be a multiple of 4; received hidden_size="
                                 f"{self.hidden_size}, num_heads={self.num_heads}")
            if self.position_embedding in ("relative", "relative_2d"):
                raise ValueError("rotary positions go with an absolute table or none; received position_embedding="
                                 f"{self.position_embedding!r} and rotary_embedding={self.rotary_embedding!r}")
            if self.rope_reference_grid is not None and self.rotary_embedding != "rope_eva":
                raise ValueError("rope_reference_grid is rope_eva's; received rotary_embedding="
                                 f"{self.rotary_embedding!r} with rope_reference_grid={self.rope_reference_grid}")
        if self.dynamic_image_size and self.position_embedding == "relative_2d":
            raise ValueError("position_embedding='relative_2d' needs a fixed grid; received dynamic_image_size=True. "
                             "Use 'relative' or build one model per resolution.")
        stochastic = (self.dropout_rate, self.attention_dropout_rate, self.drop_path_rate)
        if self.remat and self.scan_layers and any(stochastic):
            # Restoring the dropout seeds for the recomputation (EncoderBlock) assigns variables, which
            # TensorFlow cannot differentiate inside the scan's loop.
            raise ValueError("remat=True with scan_layers=True needs dropout_rate, attention_dropout_rate and "
                             f"drop_path_rate at 0; received {stochastic}. Use scan_layers=False with remat")
        if self.patch_dropout and self.position_embedding in ("relative", "relative_2d"):
            raise ValueError("patch_dropout keeps a subset of the patches, and relative positions bias attention by "
                             "offsets on the whole grid; received patch_dropout="
                             f"{self.patch_dropout}, position_embedding={self.position_embedding!r}")
        token = self.token_size
        if self.image_size[0] % token[0] or self.image_size[1] % token[1]:
            what = f"`patch_size`={self.patch_size}"
            if token != self.patch_size:
                what += f" times the ResNet stride {token[0] // self.patch_size[0]}"
            raise ValueError(f"`image_size` must be divisible by {what}; received image_size={self.image_size}")

    @property
    def token_size(self):
        """Pixels per token: the patch, times the stem's output stride for hybrids."""
        stride = 1 if self.resnet_num_layers is None else output_stride(self.resnet_num_layers)
        return (self.patch_size[0] * stride, self.patch_size[1] * stride)

    @property
    def grid_size(self):
        """(rows, cols) of the patch grid at `image_size`."""
        return tuple(size // token for size, token in zip(self.image_size, self.token_size, strict=True))

    @property
    def num_prefix_tokens(self):
        """Tokens before the patches: class, distillation, register tokens."""
        return int(self.class_token) + int(self.distilled) + self.num_register_tokens

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


def _with(**metadata):
    """The names of the fields whose metadata holds `metadata`, in field order."""
    return tuple(name for name, field in FIELDS.items()
                 if all(field.metadata[key] == value for key, value in metadata.items()))


# (height, width) fields, one int for a square; per-channel float fields.
PAIRS = _with(form=PAIR)
PER_CHANNEL = _with(form=PER_CHANNEL_FORM)
# Fields that decide what given weights compute, beyond their shapes: a checkpoint and a model it
# starts must agree on them (`differing_conventions`).
CONVENTION_FIELDS = _with(role=CONVENTION)
# Fields a dataset decides for a training run.
DATA_FIELDS = _with(role=DATA)
# Fields that shape training only: the same weights compute the same function whatever they are.
TRAINING_FIELDS = _with(role=TRAINING)


def output_stride(resnet_num_layers):
    """Pixels per feature-map position of a ResNet stem: 4 from the root, x2 per stage after the first."""
    return 4 * 2 ** max(len(resnet_num_layers) - 1, 0)


def differing_conventions(config, other):
    """The `CONVENTION_FIELDS` on which two configs differ.

    A per-channel value that is one number for every channel equals it for any channel count.
    """
    def same(mine, theirs):
        return mine == theirs or (isinstance(mine, tuple) and isinstance(theirs, tuple) and len({*mine, *theirs}) == 1)

    return [name for name in CONVENTION_FIELDS if not same(getattr(config, name), getattr(other, name))]


def field_problems(values, channels=3):
    """The message of each field of `values` (`{name: value}`) that its own check refuses, each judged alone, so a
    command line hears of every bad field at once; combinations are `ViTConfig`'s to judge."""
    problems = []
    for name, value in values.items():
        try:
            _checked(FIELDS[name], value, channels)
        except (TypeError, ValueError) as error:
            problems.append(str(error))
    return problems


def _checked(field, value, channels):
    """`value` of `field` as ViTConfig holds it, checked against the field's type and metadata."""
    name, meta = field.name, field.metadata
    if value is None and meta["optional"]:
        return None
    if meta["form"] == PAIR:
        return to_pair(value, name)
    if meta["form"] == INTS:
        return tuple(check_count(units, name, meta["low"]) for units in tuple(value))
    if meta["form"] == PER_CHANNEL_FORM:
        return _per_channel(name, value, channels)
    if meta["choices"]:
        return check_choice(value, meta["choices"], name)
    if field.type is bool:
        return check_bool(value, name)
    if field.type is int:
        return check_count(value, name, meta["low"])
    if field.type is float:
        return check_float(value, name, meta["low"], meta["high"], meta["low_open"])
    raise TypeError(f"ViTConfig field {name!r} of type {field.type!r} declares no check")


def _per_channel(name, value, channels):
    floats = tuple(float(v) for v in value)
    if len(set(floats)) == 1:  # one value for every channel (the default 0.5) fits any channel count
        floats = floats[:1] * channels
    if len(floats) != channels or not all(map(math.isfinite, floats)) or (name == "input_std" and min(floats) <= 0):
        raise ValueError(f"`{name}` must hold {channels} finite floats (one per channel)"
                         f"{', each > 0' if name == 'input_std' else ''}; received {name}={value!r}")
    return floats
