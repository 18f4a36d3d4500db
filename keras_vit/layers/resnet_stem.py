"""The ResNet stem of the hybrid ViTs (R50+ViT-B/16, R26+ViT-S/32, ...).

Section 3.1 of Dosovitskiy et al. (2021): patches are taken from a CNN
feature map. The CNN is the BiT-style ResNet of the official code
(`vit_jax/models_resnet.py`; Kolesnikov et al., 2020): weight-standardised
convolutions, GroupNorm (32 groups, epsilon 1e-6), TF 'SAME' padding for
convolutions and the stem max-pool, and post-activation bottleneck units
whose projection shortcut is standardised and normalised too.

Layer names are the official ones (`conv_root`, `gn_root`, `block{i}`,
`unit{j}`, `conv1..3`, `gn1..3`, `conv_proj`, `gn_proj`), so weight paths
read like the released checkpoints.
"""

import keras
from keras import ops

from keras_vit.checks import to_pair
from keras_vit.config import output_stride


def _group_norm(name, policy, gamma_initializer="ones"):
    # Flax's nn.GroupNorm defaults, which the checkpoints were trained with.
    return keras.layers.GroupNormalization(
        groups=32, epsilon=1e-6, gamma_initializer=gamma_initializer, dtype=policy, name=name
    )


@keras.saving.register_keras_serializable(package="keras_vit")
class StdConv2D(keras.layers.Layer):
    """A bias-free convolution with a weight-standardised kernel.

    The kernel is standardised per output channel over (height, width, in)
    as `(w - mean) / (std + 1e-5)`, exactly as the official `StdConv`.

    Args:
        filters: int. Output channels.
        kernel_size: int or (int, int).
        strides: int or (int, int). Defaults to 1.

    Example:
    >>> tuple(StdConv2D(8, 3, strides=2)(np.ones((1, 7, 7, 4))).shape)
    (1, 4, 4, 8)
    """

    def __init__(self, filters, kernel_size, strides=1, **kwargs):
        super().__init__(**kwargs)
        self.filters = int(filters)
        self.kernel_size = to_pair(kernel_size, "kernel_size")
        self.strides = to_pair(strides, "strides")

    def build(self, input_shape):
        self.kernel = self.add_weight(
            name="kernel",
            shape=(*self.kernel_size, input_shape[-1], self.filters),
            initializer="lecun_normal",
        )

    def call(self, inputs):
        kernel = ops.cast(self.kernel, "float32")
        mean = ops.mean(kernel, axis=(0, 1, 2), keepdims=True)
        std = ops.std(kernel - mean, axis=(0, 1, 2), keepdims=True)
        kernel = ops.cast((kernel - mean) / (std + 1e-5), self.compute_dtype)
        return ops.conv(ops.cast(inputs, self.compute_dtype), kernel, strides=self.strides, padding="same")

    def compute_output_shape(self, input_shape):
        spatial = [None if s is None else -(-s // k) for s, k in zip(input_shape[1:3], self.strides, strict=True)]
        return (input_shape[0], *spatial, self.filters)

    def get_config(self):
        return {**super().get_config(), "filters": self.filters,
                "kernel_size": self.kernel_size, "strides": self.strides}


@keras.saving.register_keras_serializable(package="keras_vit")
class ResidualUnit(keras.layers.Layer):
    """A bottleneck unit: 1x1, 3x3 (strided), 1x1 to `4 * features`, then
    ReLU(shortcut + branch); the shortcut is projected when the width or the
    resolution changes.

    Args:
        features: int. Bottleneck width; the unit outputs `4 * features`.
        strides: int. Stride of the 3x3 convolution. Defaults to 1.
    """

    def __init__(self, features, strides=1, **kwargs):
        super().__init__(**kwargs)
        self.features = int(features)
        self.strides = int(strides)
        policy = self.dtype_policy
        self.conv1 = StdConv2D(self.features, 1, dtype=policy, name="conv1")
        self.gn1 = _group_norm("gn1", policy)
        self.conv2 = StdConv2D(self.features, 3, self.strides, dtype=policy, name="conv2")
        self.gn2 = _group_norm("gn2", policy)
        self.conv3 = StdConv2D(4 * self.features, 1, dtype=policy, name="conv3")
        # Zero scale: each unit starts as its shortcut (the official init).
        self.gn3 = _group_norm("gn3", policy, gamma_initializer="zeros")
        self.conv_proj = self.gn_proj = None

    def build(self, input_shape):
        if input_shape[-1] != 4 * self.features or self.strides != 1:
            # Whether a projection exists depends on the input width.
            self.conv_proj = StdConv2D(4 * self.features, 1, self.strides,
                                       dtype=self.dtype_policy, name="conv_proj")
            self.gn_proj = _group_norm("gn_proj", self.dtype_policy)
            self.conv_proj.build(input_shape)
            self.gn_proj.build(self.conv_proj.compute_output_shape(input_shape))
        shape = input_shape
        for conv, norm in ((self.conv1, self.gn1), (self.conv2, self.gn2), (self.conv3, self.gn3)):
            conv.build(shape)
            shape = conv.compute_output_shape(shape)
            norm.build(shape)

    def call(self, inputs):
        shortcut = inputs
        if self.conv_proj is not None:
            shortcut = self.gn_proj(self.conv_proj(inputs))
        y = ops.relu(self.gn1(self.conv1(inputs)))
        y = ops.relu(self.gn2(self.conv2(y)))
        y = self.gn3(self.conv3(y))
        return ops.relu(shortcut + y)

    def get_config(self):
        return {**super().get_config(), "features": self.features, "strides": self.strides}


@keras.saving.register_keras_serializable(package="keras_vit")
class ResNetStem(keras.layers.Layer):
    """Root block and ResNet stages: images to the feature map the hybrid
    ViT cuts into patches.

    Root: 7x7/2 convolution of `64 * width_factor` channels, GroupNorm,
    ReLU, 3x3/2 max-pool. Stage i (named `block{i+1}`) has `num_layers[i]`
    units of bottleneck width `64 * width_factor * 2**i`; every stage but the
    first starts with stride 2. The output stride is `4 * 2**(stages - 1)`.

    Args:
        num_layers: sequence of ints. Units per stage: (3, 4, 9) for
            R50+ViT-B/16, (2, 2, 2, 2) for R26+ViT-S/32, () for the root
            alone.
        width_factor: float. Channel multiplier. Defaults to 1.

    Example:
    >>> tuple(ResNetStem((1,), width_factor=0.5)(np.ones((1, 32, 32, 3))).shape)
    (1, 8, 8, 128)
    """

    def __init__(self, num_layers, width_factor=1.0, **kwargs):
        super().__init__(**kwargs)
        self.num_layers = tuple(int(n) for n in num_layers)
        self.width_factor = float(width_factor)
        width = int(64 * self.width_factor)
        policy = self.dtype_policy
        self.conv_root = StdConv2D(width, 7, 2, dtype=policy, name="conv_root")
        self.gn_root = _group_norm("gn_root", policy)
        self.stages = []
        for i, units in enumerate(self.num_layers):
            stage = keras.Sequential(
                [ResidualUnit(width * 2**i, strides=2 if i and j == 0 else 1, dtype=policy,
                              name=f"unit{j + 1}") for j in range(units)],
                name=f"block{i + 1}",
            )
            self.stages.append(stage)

    def build(self, input_shape):
        self.conv_root.build(input_shape)
        shape = self.conv_root.compute_output_shape(input_shape)
        self.gn_root.build(shape)
        shape = (shape[0], *[None if s is None else -(-s // 2) for s in shape[1:3]], shape[3])
        for stage in self.stages:
            stage.build(shape)
            shape = stage.compute_output_shape(shape)

    def call(self, inputs):
        x = ops.relu(self.gn_root(self.conv_root(inputs)))
        x = ops.max_pool(x, pool_size=3, strides=2, padding="same")
        for stage in self.stages:
            x = stage(x)
        return x

    def compute_output_shape(self, input_shape):
        stride = output_stride(self.num_layers)
        channels = int(64 * self.width_factor) * 2 ** max(len(self.num_layers) - 1, 0)
        channels = channels * 4 if self.num_layers else channels
        spatial = [None if s is None else -(-s // stride) for s in input_shape[1:3]]
        return (input_shape[0], *spatial, channels)

    def get_config(self):
        return {**super().get_config(), "num_layers": self.num_layers, "width_factor": self.width_factor}
