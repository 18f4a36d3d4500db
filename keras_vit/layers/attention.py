"""Multi-head self-attention in the official layout, with relative positions.

The kernels are shaped as in google-research/vision_transformer
(`MultiHeadDotProductAttention_1/{query,key,value}/kernel`: (D, heads,
head_dim); `out/kernel`: (heads, head_dim, D)), so official checkpoints map
one to one. As Flax, the query is divided by sqrt(head_dim) before the dot
products.

Relative attention (Appendix D.4 of Dosovitskiy et al., 2021) adds logits
that depend on each query-key offset: `"relative"` (1-D offsets along the
sequence) and `"relative_2d"` ((row, column) offsets between patches). Each
is a module of `keras_vit.positions`, which gives its tables, its logits and
its resize; this layer holds the tables.

With `qk_norm`, each head's queries and keys are normalised over their
`head_dim` channels before the scaling and the dot products (timm's
`q_norm` / `k_norm`: one norm per projection, shared by the heads). Rotary
positions (`rotary_embedding`, `keras_vit.positions.rotary`) then turn them
by their tokens' places; `attention_norm` normalises the heads' outputs,
concatenated, before the output projection (EVA02-CLIP).
"""

import math

import keras
import numpy as np
from keras import ops

from keras_vit import positions
from keras_vit.checks import check_choice, check_count, to_pair
from keras_vit.config import NORM_LAYERS, QKV_BIASES
from keras_vit.layers.norms import norm
from keras_vit.positions import rotary
from keras_vit.positions.relative_2d import relative_2d_index  # noqa: F401 (its home before the registry)
from keras_vit.resize import INTERPOLATIONS

RELATIVE_POSITIONS = (None, *(name for name, kind in positions.KINDS.items() if kind.biases_attention))


def cudnn_attention(query, key, value):
    """`softmax(query key^T) value` as cuDNN's fused kernel, or None where JAX has none for it.

    Takes and gives `(batch, tokens, heads, head_dim)`. Only on Keras' JAX
    backend on a GPU, in half precision. Like the matmuls it replaces, it takes
    the softmax in float32. At ViT's 197 tokens cuDNN runs the forward pass as
    it is, but its backward only with the tokens padded to a multiple of 64 and
    the padding masked out (JAX refuses the other while tracing). It brings
    B/16's bf16 inference and training close to timm's under `torch.compile`
    (docs/performance.md, "GPU suite").
    """
    if keras.backend.backend() != "jax" or keras.backend.standardize_dtype(query.dtype) not in (
            "bfloat16", "float16"):
        return None
    import jax

    if jax.default_backend() != "gpu":
        return None

    def fused(*qkv, **lengths):
        return jax.nn.dot_product_attention(*qkv, scale=1.0, implementation="cudnn", **lengths)

    refused = (NotImplementedError, ValueError, RuntimeError)  # a shape, version or gradient cuDNN does not take
    try:
        return fused(query, key, value)
    except refused:
        pass
    tokens = query.shape[1]
    padding = ((0, 0), (0, -tokens % 64), (0, 0), (0, 0))
    lengths = jax.numpy.full_like(query[:, 0, 0, 0], tokens, dtype="int32")
    try:
        attended = fused(*(jax.numpy.pad(x, padding) for x in (query, key, value)),
                         query_seq_lengths=lengths, key_value_seq_lengths=lengths)
    except refused:
        return None
    return attended[:, :tokens]


@keras.saving.register_keras_serializable(package="keras_vit")
class MultiHeadSelfAttention(keras.layers.Layer):
    """Multi-head dot-product self-attention over `(batch, tokens, width)`.

    Args:
        num_heads: int. Number of heads; must divide the input width.
        attention_dropout_rate: float. Dropout on the attention weights.
            Defaults to 0.
        relative_position: None, `"relative"` or `"relative_2d"`. Adds the
            logits of relative attention. Defaults to None.
        grid_size: int or (rows, cols). Patch grid the relative tables are
            made for; required with `relative_position`.
        num_prefix_tokens: int. Tokens before the patches. Defaults to 0.
        interpolation: `"bilinear"` or `"bicubic"`: how relative tables are
            resampled for another sequence length. Defaults to `"bilinear"`.
        qkv_bias: `"all"` (official), `"none"`, or `"qv"`: query and value
            biases, the key's a fixed zero rather than a weight (EVA, BEiT;
            softmax ignores a key bias anyway). Defaults to `"all"`.
        qk_norm: bool. Normalise each head's queries and keys (`query_norm`,
            `key_norm`, over `head_dim`). Defaults to False.
        norm_layer: `"layer_norm"` or `"rms_norm"`: the kind of the q/k
            norms. Defaults to `"layer_norm"`.
        layer_norm_epsilon: float. The q/k norms' epsilon. Defaults to 1e-6.
        rotary_embedding: None, or a kind of `keras_vit.positions.rotary`
            (`"rope_axial"`, `"rope_mixed"`, `"rope_eva"`, `"rope_dinov3"`):
            queries and keys turned by their tokens' grid places, the first
            `num_prefix_tokens` left as they are; needs `grid_size`, the
            grid when the call passes no `coordinates`. Defaults to None.
        rope_theta: None (the kind's), or the frequencies' base.
        rope_reference_grid: `"rope_eva"`'s (rows, cols) reference grid.
        attention_norm: bool. A norm (of `norm_layer`) on the heads'
            outputs, concatenated, before the output projection. Defaults
            to False.

    Call arguments:
        inputs: `(batch, tokens, width)`.
        training: bool. Whether dropout is active.
        return_attention_scores: bool. Also return the attention weights,
            `(batch, heads, tokens, tokens)`.
        query_tokens: None, or k: only the first k tokens ask (attend over
            every token); the output then has k tokens. Not with relative
            positions, whose logits are made for a square of tokens.
        coordinates: None, or the tokens' `(tokens, 2)` rotary coordinates
            (`keras_vit.positions.rotary.coordinates`) for a grid known only
            at run time; None: those of `grid_size`.
        token_indices: None, or `(batch, tokens)` ints: each token's place
            in the sequence the rotary coordinates are for, in increasing
            order (`PatchDropout`'s kept tokens), so each takes its own
            place's angles; None: the tokens are that whole sequence. Indices
            as many as the places are every place in order, left ungathered.

    Returns:
        `(batch, tokens, width)`, and the weights if asked for.

    Example:
    >>> layer = MultiHeadSelfAttention(num_heads=4)
    >>> tuple(layer(np.zeros((2, 17, 64))).shape)
    (2, 17, 64)
    """

    def __init__(
        self,
        num_heads,
        attention_dropout_rate=0.0,
        relative_position=None,
        grid_size=None,
        num_prefix_tokens=0,
        interpolation="bilinear",
        qkv_bias="all",
        qk_norm=False,
        norm_layer="layer_norm",
        layer_norm_epsilon=1e-6,
        rotary_embedding=None,
        rope_theta=None,
        rope_reference_grid=None,
        attention_norm=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = check_count(num_heads, "num_heads", minimum=1)
        self.qk_norm = bool(qk_norm)
        self.norm_layer = check_choice(norm_layer, NORM_LAYERS, "norm_layer")
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.query_norm, self.key_norm = (
            [norm(norm_layer, self.layer_norm_epsilon, f"{name}_norm", self.dtype_policy) for name in ("query", "key")]
            if self.qk_norm else (None, None))
        self.qkv_bias = check_choice(qkv_bias, QKV_BIASES, "qkv_bias")
        # The projections with a bias weight; the others add nothing.
        self._biased = {"all": ("query", "key", "value"), "none": (), "qv": ("query", "value")}[self.qkv_bias]
        self.attention_dropout_rate = float(attention_dropout_rate)
        self.relative_position = check_choice(
            relative_position, RELATIVE_POSITIONS, "relative_position"
        )
        self.rotary_embedding = check_choice(rotary_embedding, (None, *rotary.NAMES), "rotary_embedding")
        self.rope_theta = None if rope_theta is None else float(rope_theta)
        self.rope_reference_grid = None if rope_reference_grid is None else to_pair(rope_reference_grid,
                                                                                     "rope_reference_grid")
        if self.rotary_embedding and relative_position:
            raise ValueError(f"rotary_embedding={rotary_embedding!r} and relative_position={relative_position!r} "
                             "are two position rules for one attention: give one")
        if self.rotary_embedding == "rope_eva" and self.rope_reference_grid is None:
            raise ValueError("rotary_embedding='rope_eva' needs `rope_reference_grid`; received None")
        for rule in (relative_position, self.rotary_embedding):
            if rule and grid_size is None:
                raise ValueError(f"{rule!r} needs `grid_size`; received grid_size=None")
        self.attention_norm = bool(attention_norm)
        self.output_norm = (norm(norm_layer, self.layer_norm_epsilon, "output_norm", self.dtype_policy)
                            if self.attention_norm else None)
        self.grid_size = None if grid_size is None else to_pair(grid_size, "grid_size")
        # The relative kind's tables, logits and resize (keras_vit.positions); "none" without.
        self.position = positions.get(relative_position or "none")
        self.num_prefix_tokens = check_count(num_prefix_tokens, "num_prefix_tokens")
        self.interpolation = check_choice(interpolation, INTERPOLATIONS, "interpolation")
        self.dropout = keras.layers.Dropout(
            self.attention_dropout_rate, dtype=self.dtype_policy, name="dropout"
        )

    def build(self, input_shape):
        if len(input_shape) != 3 or input_shape[-1] is None:
            raise ValueError(
                "MultiHeadSelfAttention expects (batch, tokens, width) with a known width; "
                f"received input_shape={tuple(input_shape)}"
            )
        width = input_shape[-1]
        if width % self.num_heads:
            raise ValueError(
                f"The width must be divisible by `num_heads`={self.num_heads}; received width={width}"
            )
        head_dim = width // self.num_heads
        # Xavier-uniform over the flat (width, heads * head_dim) matrix, as
        # the official code initialises its DenseGeneral kernels.
        limit = math.sqrt(6.0 / (width + self.num_heads * head_dim))

        def kernel_init():  # one per weight (keras_vit.layers.initializers says why)
            return keras.initializers.RandomUniform(-limit, limit)

        projection = (width, self.num_heads, head_dim)
        for name in ("query", "key", "value"):
            setattr(self, f"{name}_kernel", self.add_weight(
                name=f"{name}_kernel", shape=projection, initializer=kernel_init()))
            if name in self._biased:
                setattr(self, f"{name}_bias", self.add_weight(
                    name=f"{name}_bias", shape=projection[1:], initializer="zeros"))
        self.output_kernel = self.add_weight(
            name="output_kernel", shape=(self.num_heads, head_dim, width), initializer=kernel_init()
        )
        self.output_bias = self.add_weight(name="output_bias", shape=(width,), initializer="zeros")
        if self.qk_norm:
            for layer in (self.query_norm, self.key_norm):
                layer.build((None, None, self.num_heads, head_dim))
        if self.attention_norm:
            self.output_norm.build((None, None, width))
        if self.rotary_embedding:
            rotary.check_head_dim(self.rotary_embedding, head_dim)
        if self.rotary_embedding == "rope_mixed":
            theta = rotary.THETAS["rope_mixed"] if self.rope_theta is None else self.rope_theta
            initializer = rotary.MixedFrequencies(self.num_heads, head_dim, theta)
            self.rope_frequencies = self.add_weight(name=rotary.FREQUENCIES, shape=(2, self.num_heads, head_dim // 2),
                                                    initializer=initializer)
        shapes = self.position.weight_shapes(width, self.grid_size, self.num_prefix_tokens, self.num_heads)
        for name, shape in shapes.items():  # self.relative_embedding, ...: N(0, 0.02), as the official position table
            setattr(self, name, self.add_weight(
                name=name, shape=shape, initializer=keras.initializers.RandomNormal(stddev=0.02)))
        self.dropout.build(None)

    def _position_weights(self):
        return {name: getattr(self, name) for name in self.position.weight_names}

    def relative_logits(self, query):
        """Logits of the relative attention, `(batch, heads, L, L)`."""
        return self.position.logits(
            self._position_weights(), query, self.grid_size, self.num_prefix_tokens, self.interpolation
        )

    def resized_weights(self, grid_size):
        """Relative tables resampled for `grid_size`, as float32 numpy arrays.

        Returns a dict keyed by weight name (empty without relative position).
        """
        tables = {name: np.asarray(w.numpy(), np.float64) for name, w in self._position_weights().items()}
        return self.position.resize(
            tables, to_pair(grid_size, "grid_size"), self.num_prefix_tokens, self.interpolation, self.grid_size
        )

    def rotary_tables(self, coordinates=None, dtype="float32"):
        """`(cos, sin)` of each token's pair angles, `(tokens, 1 or heads, head_dim / 2)`, for `coordinates`
        (None: `grid_size`'s, computed in float64 and constant when the frequencies are fixed)."""
        head_dim = self.query_kernel.shape[-1]
        if coordinates is None:
            coordinates = rotary.coordinates(self.rotary_embedding, self.grid_size, self.num_prefix_tokens,
                                             self.rope_reference_grid)
        if self.rotary_embedding == "rope_mixed":
            frequencies = ops.cast(self.rope_frequencies, "float32")
            angles = rotary.angles(ops.cast(coordinates, "float32"), frequencies)
        else:
            frequencies = rotary.frequencies(self.rotary_embedding, head_dim, self.rope_theta)
            if isinstance(coordinates, np.ndarray):
                angles = (coordinates @ frequencies)[:, None, :]
                return ops.cast(np.cos(angles), dtype), ops.cast(np.sin(angles), dtype)
            angles = rotary.angles(coordinates, ops.cast(frequencies, "float32"))
        return ops.cast(ops.cos(angles), dtype), ops.cast(ops.sin(angles), dtype)

    def call(self, inputs, training=None, return_attention_scores=False, query_tokens=None, coordinates=None,
             token_indices=None):
        # Queries and keys come out with each rotary pair in halves where no norm sits before the turn.
        in_halves = bool(self.rotary_embedding) and not self.qk_norm

        def project(name, tokens):
            def weight(kind):
                w = getattr(self, f"{name}_{kind}")
                return rotary.halves_first(self.rotary_embedding, w) if in_halves and name != "value" else w

            projected = ops.einsum("btd,dhk->bthk", tokens, weight("kernel"))
            if name in self._biased:
                projected = projected + weight("bias")
            normed = {"query": self.query_norm, "key": self.key_norm}.get(name)
            return normed(projected) if normed is not None else projected

        if query_tokens is not None and self.position.biases_attention:
            raise ValueError(f"query_tokens={query_tokens} cannot be used with relative_position="
                             f"{self.relative_position!r}: its logits are made for every token asking")
        head_dim = self.query_kernel.shape[-1]
        asking = inputs if query_tokens is None else inputs[:, :query_tokens]
        query = project("query", asking) / ops.cast(math.sqrt(head_dim), inputs.dtype)
        key, value = project("key", inputs), project("value", inputs)
        if self.rotary_embedding:
            cos, sin = self.rotary_tables(coordinates, query.dtype)
            # Each example's tokens take their own places' angles: (batch, tokens, 1 or heads, head_dim / 2).
            # As many indices as places are every place in order (PatchDropout keeps the order): no gather.
            if token_indices is not None and (token_indices.shape[1] or -1) != cos.shape[0]:
                cos, sin = ops.take(cos, token_indices, axis=0), ops.take(sin, token_indices, axis=0)
            asked = query.shape[1] if query_tokens is None else query_tokens
            query = rotary.rotate(self.rotary_embedding, query, cos[..., :asked, :, :] if query_tokens else cos,
                                  sin[..., :asked, :, :] if query_tokens else sin, in_halves)
            key = rotary.rotate(self.rotary_embedding, key, cos, sin, in_halves)
        fused = None
        weights_needed = training and self.attention_dropout_rate  # dropout on them
        # cuDNN's padded path takes as many queries as keys: a subset of queries runs unfused.
        if not (return_attention_scores or self.position.biases_attention or weights_needed or query_tokens):
            fused = cudnn_attention(query, key, value)
        attended, weights = (fused, None) if fused is not None else self._attend(query, key, value, training)
        if self.attention_norm:  # over the heads concatenated: (batch, tokens, heads * head_dim), then one matmul
            tokens = attended.shape[1] if attended.shape[1] is not None else ops.shape(attended)[1]
            heads, head_dim = self.output_kernel.shape[:2]
            merged = self.output_norm(ops.reshape(attended, (-1, tokens, heads * head_dim)))
            outputs = ops.matmul(merged, ops.reshape(self.output_kernel, (heads * head_dim, -1))) + self.output_bias
        else:
            outputs = ops.einsum("bqhd,hdo->bqo", attended, self.output_kernel) + self.output_bias
        return (outputs, weights) if return_attention_scores else outputs

    def _attend(self, query, key, value, training):
        """`(attended, weights)`: `(batch, tokens, heads, head_dim)` and `(batch, heads, tokens, tokens)`."""
        # The two attention products run heads first, as batched matmuls: XLA:CPU on JAX ran the same
        # einsums over (batch, tokens, heads, dim) far slower (B/16 inference: docs/performance.md).
        logits = ops.matmul(ops.transpose(query, (0, 2, 1, 3)), ops.transpose(key, (0, 2, 3, 1)))
        if self.position.biases_attention:
            logits = logits + self.relative_logits(query)
        # Softmax in float32: under mixed precision bf16 logits lose the
        # small differences that decide the attention pattern.
        weights = ops.cast(ops.softmax(ops.cast(logits, "float32"), axis=-1), query.dtype)
        attended = ops.matmul(self.dropout(weights, training=training), ops.transpose(value, (0, 2, 1, 3)))
        return ops.transpose(attended, (0, 2, 1, 3)), weights

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "attention_dropout_rate": self.attention_dropout_rate,
            "relative_position": self.relative_position,
            "grid_size": self.grid_size,
            "num_prefix_tokens": self.num_prefix_tokens,
            "interpolation": self.interpolation,
            "qkv_bias": self.qkv_bias,
            "qk_norm": self.qk_norm,
            "norm_layer": self.norm_layer,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "rotary_embedding": self.rotary_embedding,
            "rope_theta": self.rope_theta,
            "rope_reference_grid": self.rope_reference_grid,
            "attention_norm": self.attention_norm,
        }
