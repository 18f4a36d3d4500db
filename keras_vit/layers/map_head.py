"""Multihead attention pooling (MAP): a learned probe that attends over the tokens.

big_vision's `MAPHead` (`big_vision/models/vit.py`; timm's
`AttentionPoolLatent`, `global_pool="map"`), the pooling of its `pool_type="map"`
ViTs and of the SigLIP image towers:

    x = MultiHeadAttention(query=probe, keys=values=tokens)
    x = x + Mlp(LayerNorm(x))
    return x[:, 0]

The weights keep big_vision's shapes, so `MAPHead_0/probe` (1, 1, D),
`MultiHeadDotProductAttention_0/{query,key,value}/kernel` (D, heads, head_dim),
`out/kernel` (heads, head_dim, D), `LayerNorm_0` and `MlpBlock_0/Dense_{0,1}`
map one to one. As Flax and timm, the query is divided by sqrt(head_dim).
"""

import math

import keras
from keras import ops

from keras_vit.checks import check_count
from keras_vit.layers.encoder_block import Mlp, resolve_activation


@keras.saving.register_keras_serializable(package="keras_vit")
class MAPHead(keras.layers.Layer):
    """Pools `(batch, tokens, width)` to `(batch, width)` by a learned probe's attention.

    Args:
        num_heads: int. Attention heads; must divide the width.
        mlp_dim: int. Hidden width of the MLP after the attention.
        num_prefix_tokens: int. Tokens before the patches (class, register
            tokens), left out of the attention as timm's
            `pool_include_prefix=False`. Defaults to 0.
        layer_norm_epsilon: float. Defaults to 1e-6 (big_vision's).
        gelu_approximate: bool. GELU of the MLP by its tanh approximation
            (big_vision) or exact. Defaults to True.
        activation: `"gelu"` or `"quick_gelu"`: the MLP's (`Mlp`). Defaults
            to `"gelu"`.

    Call arguments:
        inputs: `(batch, tokens, width)`.
        return_attention_scores: bool. Also return the probe's attention
            weights over the pooled tokens, `(batch, heads, 1, tokens)`.

    Returns:
        `(batch, width)`, and the weights if asked for.

    Example:
    >>> tuple(MAPHead(num_heads=2, mlp_dim=32)(np.zeros((2, 5, 8))).shape)
    (2, 8)
    """

    def __init__(self, num_heads, mlp_dim, num_prefix_tokens=0, layer_norm_epsilon=1e-6, gelu_approximate=True,
                 activation="gelu", **kwargs):
        super().__init__(**kwargs)
        self.num_heads = check_count(num_heads, "num_heads", minimum=1)
        self.mlp_dim = check_count(mlp_dim, "mlp_dim", minimum=1)
        self.num_prefix_tokens = check_count(num_prefix_tokens, "num_prefix_tokens")
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.activation, self.gelu_approximate = resolve_activation(activation, gelu_approximate)
        policy = self.dtype_policy
        self.norm = keras.layers.LayerNormalization(epsilon=self.layer_norm_epsilon, dtype=policy, name="norm")
        self.mlp = Mlp(self.mlp_dim, gelu_approximate=self.gelu_approximate, activation=self.activation, dtype=policy,
                       name="mlp")

    def build(self, input_shape):
        if len(input_shape) != 3 or input_shape[-1] is None:
            raise ValueError("MAPHead expects (batch, tokens, width) with a known width; "
                             f"received input_shape={tuple(input_shape)}")
        width = input_shape[-1]
        if width % self.num_heads:
            raise ValueError(f"The width must be divisible by `num_heads`={self.num_heads}; received width={width}")
        head_dim = width // self.num_heads
        # Xavier-uniform over the flat (width, width) matrices, as big_vision initialises its probe and kernels.
        limit = math.sqrt(6.0 / (2 * width))
        self.probe = self.add_weight(name="probe", shape=(1, 1, width), initializer="glorot_uniform")
        for name in ("query", "key", "value"):
            setattr(self, f"{name}_kernel", self.add_weight(
                name=f"{name}_kernel", shape=(width, self.num_heads, head_dim),
                initializer=keras.initializers.RandomUniform(-limit, limit)))
            setattr(self, f"{name}_bias", self.add_weight(
                name=f"{name}_bias", shape=(self.num_heads, head_dim), initializer="zeros"))
        self.output_kernel = self.add_weight(name="output_kernel", shape=(self.num_heads, head_dim, width),
                                             initializer=keras.initializers.RandomUniform(-limit, limit))
        self.output_bias = self.add_weight(name="output_bias", shape=(width,), initializer="zeros")
        self.norm.build((None, 1, width))
        self.mlp.build((None, 1, width))

    def call(self, inputs, return_attention_scores=False):
        tokens = inputs[:, self.num_prefix_tokens:]
        probe = ops.broadcast_to(ops.cast(self.probe, tokens.dtype), (ops.shape(tokens)[0], 1, tokens.shape[-1]))
        head_dim = self.query_kernel.shape[-1]
        query = ops.einsum("bqd,dhk->bqhk", probe, self.query_kernel) + self.query_bias
        query = query / ops.cast(math.sqrt(head_dim), query.dtype)
        key = ops.einsum("btd,dhk->bthk", tokens, self.key_kernel) + self.key_bias
        value = ops.einsum("btd,dhk->bthk", tokens, self.value_kernel) + self.value_bias
        logits = ops.einsum("bqhk,bthk->bhqt", query, key)
        # Softmax in float32, as the encoder's attention (mixed precision).
        weights = ops.cast(ops.softmax(ops.cast(logits, "float32"), axis=-1), query.dtype)
        attended = ops.einsum("bhqt,bthk->bqhk", weights, value)
        pooled = ops.einsum("bqhk,hkd->bqd", attended, self.output_kernel) + self.output_bias
        pooled = (pooled + self.mlp(self.norm(pooled)))[:, 0]
        return (pooled, weights) if return_attention_scores else pooled

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])

    def compute_output_spec(self, inputs, return_attention_scores=False):
        pooled = keras.KerasTensor((inputs.shape[0], inputs.shape[-1]), dtype=self.compute_dtype)
        if not return_attention_scores:
            return pooled
        tokens = None if inputs.shape[1] is None else inputs.shape[1] - self.num_prefix_tokens
        return pooled, keras.KerasTensor((inputs.shape[0], self.num_heads, 1, tokens), dtype=self.compute_dtype)

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "mlp_dim": self.mlp_dim,
                "num_prefix_tokens": self.num_prefix_tokens, "layer_norm_epsilon": self.layer_norm_epsilon,
                "gelu_approximate": self.gelu_approximate, "activation": self.activation}
