"""The Transformer encoder block and its MLP (Section 3.1, Eq. 2-3).

Pre-norm, as `Encoder1DBlock` of google-research/vision_transformer:
    x = x + DropPath(Dropout(Attention(LayerNorm(x))))
    x = x + DropPath(Mlp(LayerNorm(x)))
LayerNorm epsilon is 1e-6 (Keras defaults to 1e-3) and GELU uses its tanh
approximation (the Flax default): the official checkpoints were trained with
both. timm's checkpoints use the exact (erf) GELU: `gelu_approximate=False`;
CLIP's use QuickGELU, `activation="quick_gelu"`.
With `layer_scale_init`, each branch is multiplied by a learned per-channel
scale before the stochastic depth (timm's `ls1` / `ls2`, DeiT III, DINOv2).
The norms may be RMSNorms (`norm_layer`), the MLP gated (SwiGLU: `gated_mlp`
with `activation="silu"`), and attention may normalise queries and keys
(`qk_norm`), turn them by rotary positions (`rotary_embedding`) and
normalise its output (`attention_norm`); the MLP may normalise its hidden
units (`mlp_norm`, EVA02's sub-LN).
"""

import keras
from keras import ops

from keras_vit.checks import check_choice, check_count
from keras_vit.config import ACTIVATIONS, NORM_LAYERS
from keras_vit.layers.attention import MultiHeadSelfAttention
from keras_vit.layers.drop_path import DropPath
from keras_vit.layers.gradient_boundary import gradient_boundary
from keras_vit.layers.layer_scale import LayerScale
from keras_vit.layers.norms import norm


def resolve_activation(activation, gelu_approximate):
    """`(activation, gelu_approximate)` as `ViTConfig` holds them: QuickGELU has no GELU form, held False.

    Layer configs of `.keras` files written before `activation` hold `gelu_approximate` alone: GELU.
    """
    activation = check_choice(activation, ACTIVATIONS, "activation")
    return activation, bool(gelu_approximate) and activation == "gelu"


def activate(x, activation, gelu_approximate):
    """The MLP's nonlinearity: GELU (tanh or exact), QuickGELU `x * sigmoid(1.702 x)` (CLIP's) or SiLU."""
    if activation == "quick_gelu":
        return x * ops.sigmoid(1.702 * x)
    if activation == "silu":
        return x * ops.sigmoid(x)
    return ops.gelu(x, approximate=gelu_approximate)


def _affine(dense, rows):
    """`dense` applied to 2-D `rows`; on TensorFlow as MatMul and BiasAdd, the form the remapper fuses with GELU."""
    if dense.quantization_mode or keras.backend.backend() != "tensorflow":
        return dense(rows)  # a quantized Dense (keras.Model.quantize) computes its own way
    import tensorflow as tf

    return tf.nn.bias_add(ops.matmul(rows, dense.kernel), dense.bias)


@keras.saving.register_keras_serializable(package="keras_vit")
class Mlp(keras.layers.Layer):
    """Dense, activation (GELU), dropout, dense, dropout; or gated (GLU).

    Gated, `dense_1` gives `2 * mlp_dim` channels: the first half is the
    gate, the second the value, and `activation(gate) * value` goes on (timm's
    `SwiGLUPacked` and `SwiGLU`, transformers' DINOv2 SwiGLU, with SiLU).

    Args:
        mlp_dim: int. Hidden width (4x the model width in every variant).
        dropout_rate: float. Dropout after each dense layer. Defaults to 0.
        gelu_approximate: bool. GELU by its tanh approximation (official)
            or exact (timm). Defaults to True.
        activation: `"gelu"` or `"quick_gelu"` (CLIP's `x * sigmoid(1.702 x)`,
            which holds `gelu_approximate` False) or `"silu"`. Defaults to
            `"gelu"`.
        gated: bool. A gated MLP (see above). Defaults to False.
        hidden_norm: None, or `"layer_norm"` / `"rms_norm"`: a norm `norm` on
            the hidden units, after the activation and its dropout, before
            `dense_2` (timm's `scale_mlp`). Defaults to None.
        layer_norm_epsilon: float. That norm's epsilon. Defaults to 1e-6.

    Example:
    >>> tuple(Mlp(mlp_dim=32)(np.zeros((2, 5, 8))).shape)
    (2, 5, 8)
    """

    def __init__(self, mlp_dim, dropout_rate=0.0, gelu_approximate=True, activation="gelu", gated=False,
                 hidden_norm=None, layer_norm_epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        self.hidden_norm = None if hidden_norm is None else check_choice(hidden_norm, NORM_LAYERS, "hidden_norm")
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.norm = None if hidden_norm is None else norm(hidden_norm, self.layer_norm_epsilon, "norm",
                                                          self.dtype_policy)
        self.mlp_dim = int(mlp_dim)
        self.dropout_rate = float(dropout_rate)
        self.activation, self.gelu_approximate = resolve_activation(activation, gelu_approximate)
        self.gated = bool(gated)
        self.dense_1 = self._dense(self.mlp_dim * (2 if self.gated else 1), "dense_1")
        self.dropout = keras.layers.Dropout(self.dropout_rate, dtype=self.dtype_policy, name="dropout")

    def _dense(self, units, name):
        # Xavier-uniform kernels, biases ~N(0, 1e-6): the official MlpBlock.
        return keras.layers.Dense(
            units,
            kernel_initializer="glorot_uniform",
            bias_initializer=keras.initializers.RandomNormal(stddev=1e-6),
            dtype=self.dtype_policy,
            name=name,
        )

    def build(self, input_shape):
        self.dense_1.build(input_shape)
        # The output width is the input's, only known here.
        self.dense_2 = self._dense(input_shape[-1], "dense_2")
        self.dense_2.build((*input_shape[:-1], self.mlp_dim))
        if self.norm is not None:
            self.norm.build((None, self.mlp_dim))

    def call(self, inputs, training=None):
        # The tokens as the rows of 2-D matmuls with BiasAdd (`_affine`): TensorFlow's graph optimizer
        # (grappler's remapper, oneDNN) then runs matmul, bias and GELU as one kernel. It matches no other form,
        # and an unfused GELU is a sizeable share of B/16's inference in the graph (docs/performance.md).
        rows = ops.reshape(inputs, (-1, inputs.shape[-1]))
        hidden = _affine(self.dense_1, rows)
        if self.gated:
            gate, value = hidden[:, : self.mlp_dim], hidden[:, self.mlp_dim :]
            hidden = activate(gate, self.activation, self.gelu_approximate) * value
        else:
            hidden = activate(hidden, self.activation, self.gelu_approximate)
        hidden = self.dropout(hidden, training=training)
        if self.norm is not None:
            hidden = self.norm(hidden)
        outputs = ops.reshape(_affine(self.dense_2, hidden), ops.shape(inputs))
        return self.dropout(outputs, training=training)

    def get_config(self):
        return {**super().get_config(), "mlp_dim": self.mlp_dim, "dropout_rate": self.dropout_rate,
                "gelu_approximate": self.gelu_approximate, "activation": self.activation, "gated": self.gated,
                "hidden_norm": self.hidden_norm, "layer_norm_epsilon": self.layer_norm_epsilon}


@keras.saving.register_keras_serializable(package="keras_vit")
class EncoderBlock(keras.layers.Layer):
    """One pre-norm Transformer encoder block.

    Args:
        num_heads: int. Attention heads.
        mlp_dim: int. Hidden width of the MLP.
        dropout_rate: float. Dropout after attention and in the MLP.
            Defaults to 0.
        attention_dropout_rate: float. Dropout on attention weights.
            Defaults to 0.
        drop_path_rate: float. Stochastic depth of both residual branches.
            Defaults to 0.
        layer_norm_epsilon: float. Defaults to 1e-6 (the official value).
        gelu_approximate: bool. Passed to `Mlp`. Defaults to True.
        activation: `"gelu"` or `"quick_gelu"`. Passed to `Mlp`. Defaults
            to `"gelu"`.
        qkv_bias: `"all"`, `"none"` or `"qv"`. Passed to
            `MultiHeadSelfAttention`. Defaults to `"all"`.
        qk_norm: bool. Passed to `MultiHeadSelfAttention`. Defaults to False.
        norm_layer: `"layer_norm"` or `"rms_norm"`: the kind of `norm_1`,
            `norm_2` and the q/k norms. Defaults to `"layer_norm"`.
        gated_mlp: bool. Passed to `Mlp` as `gated`. Defaults to False.
        layer_scale_init: None, or a float > 0: LayerScale after attention
            (`layer_scale_1`) and after the MLP (`layer_scale_2`), each
            `gamma` starting at this value (timm's `init_values`).
            Defaults to None (none).
        relative_position, grid_size, num_prefix_tokens, interpolation,
            rotary_embedding, rope_theta, rope_reference_grid,
            attention_norm: passed to `MultiHeadSelfAttention`.
        mlp_norm: bool. A norm on the MLP's hidden units (`Mlp`'s
            `hidden_norm`). Defaults to False.
        remat: bool. In training, recompute the block in the backward pass
            instead of keeping its activations (`keras.remat`); the
            recomputation draws the forward's dropout masks. Defaults to False.
        output_tokens: None (every token), or k: the block computes and
            returns only the first k tokens, the others serving as keys and
            values. A last block whose head reads the class token needs
            only it (`keras_vit.trim_last_block`). Defaults to None.

    Call arguments:
        inputs: `(batch, tokens, width)`.
        training: bool.
        return_attention_scores: bool. Also return the attention weights.
        drop_path_rate: None, or this call's stochastic depth (a float or
            a scalar tensor) in place of the layer's.
        coordinates: None, or the tokens' rotary coordinates, passed to
            `MultiHeadSelfAttention` (a `dynamic_image_size` model's grid).
        token_indices: None, or each token's place in the full sequence
            (`PatchDropout`'s), passed to `MultiHeadSelfAttention`.

    Returns:
        `(batch, tokens, width)` (`output_tokens` tokens when set), and the
        attention weights if asked for.

    Example:
    >>> tuple(EncoderBlock(num_heads=2, mlp_dim=32)(np.zeros((2, 5, 8))).shape)
    (2, 5, 8)
    """

    def __init__(
        self,
        num_heads,
        mlp_dim,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        drop_path_rate=0.0,
        layer_norm_epsilon=1e-6,
        gelu_approximate=True,
        relative_position=None,
        grid_size=None,
        num_prefix_tokens=0,
        interpolation="bilinear",
        remat=False,
        output_tokens=None,
        activation="gelu",
        qkv_bias="all",
        layer_scale_init=None,
        qk_norm=False,
        norm_layer="layer_norm",
        gated_mlp=False,
        rotary_embedding=None,
        rope_theta=None,
        rope_reference_grid=None,
        attention_norm=False,
        mlp_norm=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.remat = bool(remat)
        if output_tokens is not None and relative_position:
            raise ValueError(f"output_tokens={output_tokens} cannot be used with relative_position="
                             f"{relative_position!r}: its logits are made for every token asking")
        self.output_tokens = None if output_tokens is None else check_count(output_tokens, "output_tokens", minimum=1)
        self.num_heads = num_heads
        self.mlp_dim = mlp_dim
        self.dropout_rate = float(dropout_rate)
        self.attention_dropout_rate = float(attention_dropout_rate)
        self.drop_path_rate = float(drop_path_rate)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.activation, self.gelu_approximate = resolve_activation(activation, gelu_approximate)
        self.qkv_bias = qkv_bias
        self.layer_scale_init = None if layer_scale_init is None else float(layer_scale_init)
        self.qk_norm, self.norm_layer, self.gated_mlp = bool(qk_norm), norm_layer, bool(gated_mlp)
        self.relative_position = relative_position
        self.grid_size = grid_size
        self.num_prefix_tokens = num_prefix_tokens
        self.interpolation = interpolation
        self.rotary_embedding, self.rope_theta = rotary_embedding, rope_theta
        self.rope_reference_grid = rope_reference_grid
        self.attention_norm, self.mlp_norm = bool(attention_norm), bool(mlp_norm)
        policy = self.dtype_policy
        self.norm_1 = norm(norm_layer, self.layer_norm_epsilon, "norm_1", policy)
        self.attention = MultiHeadSelfAttention(
            num_heads,
            attention_dropout_rate=attention_dropout_rate,
            relative_position=relative_position,
            grid_size=grid_size,
            num_prefix_tokens=num_prefix_tokens,
            interpolation=interpolation,
            qkv_bias=qkv_bias,
            qk_norm=self.qk_norm,
            norm_layer=norm_layer,
            layer_norm_epsilon=self.layer_norm_epsilon,
            rotary_embedding=rotary_embedding,
            rope_theta=rope_theta,
            rope_reference_grid=rope_reference_grid,
            attention_norm=self.attention_norm,
            dtype=policy,
            name="attention",
        )
        self.dropout = keras.layers.Dropout(self.dropout_rate, dtype=policy, name="dropout")
        self.norm_2 = norm(norm_layer, self.layer_norm_epsilon, "norm_2", policy)
        self.mlp = Mlp(mlp_dim, dropout_rate, self.gelu_approximate, self.activation, self.gated_mlp,
                       hidden_norm=norm_layer if self.mlp_norm else None, layer_norm_epsilon=self.layer_norm_epsilon,
                       dtype=policy, name="mlp")
        self.drop_path = DropPath(self.drop_path_rate, dtype=policy, name="drop_path")
        # Named as norm_1 / norm_2; timm's ls1.gamma / ls2.gamma.
        self.layer_scales = [] if self.layer_scale_init is None else [
            LayerScale(self.layer_scale_init, dtype=policy, name=f"layer_scale_{i}") for i in (1, 2)]

    def build(self, input_shape):
        for layer in (self.norm_1, self.attention, self.norm_2, self.mlp, *self.layer_scales):
            layer.build(input_shape)

    def call(self, inputs, training=None, return_attention_scores=False, drop_path_rate=None, coordinates=None,
             token_indices=None):
        if self.remat and training and not return_attention_scores:
            outputs = self._rematerialized(inputs, drop_path_rate, coordinates, token_indices)
        else:
            outputs = self._forward(inputs, training, return_attention_scores, drop_path_rate, coordinates,
                                    token_indices)
        if return_attention_scores:
            outputs, scores = outputs
        # The residual stream's gradient is written out at each block's output (on JAX's CPU: see there).
        outputs = gradient_boundary(outputs)
        return (outputs, scores) if return_attention_scores else outputs

    def compute_output_spec(self, inputs, training=None, return_attention_scores=False, drop_path_rate=None,
                            coordinates=None, token_indices=None):
        # Said here, so that Keras need not trace `call` to learn it: that tracing was half
        # the time of building a ViT with the functional API.
        if return_attention_scores:
            return super().compute_output_spec(inputs, training, return_attention_scores, drop_path_rate,
                                               coordinates, token_indices)
        shape = inputs.shape if self.output_tokens is None else (inputs.shape[0], self.output_tokens, inputs.shape[2])
        return keras.KerasTensor(shape, dtype=self.compute_dtype)

    def _rematerialized(self, inputs, drop_path_rate, coordinates, token_indices):
        """The training forward under `keras.remat`, which runs it again in the backward pass.

        Dropout and stochastic depth draw from seed generators that each
        draw advances; the states read before the forward are passed in and
        restored first, so the recomputation draws the same masks.
        """
        generators = self.seed_generators()

        def forward(x, *states):
            for generator, state in zip(generators, states, strict=True):
                generator.state.assign(state)
            return self._forward(x, True, False, drop_path_rate, coordinates, token_indices)

        return keras.remat(forward)(inputs, *[ops.convert_to_tensor(g.state.value) for g in generators])

    def seed_generators(self):
        """The seed generators of the block's random layers (a layer with rate 0 has none)."""
        random_layers = (self.attention.dropout, self.dropout, self.mlp.dropout, self.drop_path)
        return [g for layer in random_layers if (g := getattr(layer, "seed_generator", None)) is not None]

    def _forward(self, inputs, training, return_attention_scores, drop_path_rate, coordinates=None,
                 token_indices=None):
        # Weights only when asked for: without them attention may run fused (MultiHeadSelfAttention).
        attended = self.attention(self.norm_1(inputs), training=training,
                                  return_attention_scores=return_attention_scores, query_tokens=self.output_tokens,
                                  coordinates=coordinates, token_indices=token_indices)
        if return_attention_scores:
            attended, scores = attended
        attended = self.dropout(attended, training=training)
        residual = inputs if self.output_tokens is None else inputs[:, : self.output_tokens]
        x = residual + self.drop_path(self._scaled(0, attended), training=training, rate=drop_path_rate)
        branch = self._scaled(1, self.mlp(self.norm_2(x), training=training))
        x = x + self.drop_path(branch, training=training, rate=drop_path_rate)
        return (x, scores) if return_attention_scores else x

    def _scaled(self, index, branch):
        """Residual branch `index` (0: attention, 1: MLP) times its LayerScale, if the block has them."""
        return self.layer_scales[index](branch) if self.layer_scales else branch

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "mlp_dim": self.mlp_dim,
            "dropout_rate": self.dropout_rate,
            "attention_dropout_rate": self.attention_dropout_rate,
            "drop_path_rate": self.drop_path_rate,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "gelu_approximate": self.gelu_approximate,
            "relative_position": self.relative_position,
            "grid_size": self.grid_size,
            "num_prefix_tokens": self.num_prefix_tokens,
            "interpolation": self.interpolation,
            "remat": self.remat,
            "output_tokens": self.output_tokens,
            "activation": self.activation,
            "qkv_bias": self.qkv_bias,
            "layer_scale_init": self.layer_scale_init,
            "qk_norm": self.qk_norm,
            "norm_layer": self.norm_layer,
            "gated_mlp": self.gated_mlp,
            "rotary_embedding": self.rotary_embedding,
            "rope_theta": self.rope_theta,
            "rope_reference_grid": self.rope_reference_grid,
            "attention_norm": self.attention_norm,
            "mlp_norm": self.mlp_norm,
        }
