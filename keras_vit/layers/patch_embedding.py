"""Patch embedding: the image (or a CNN feature map) cut into patches.

Section 3.1 of Dosovitskiy et al. (2021): each p x p patch is flattened and
linearly projected to the model width. A convolution with kernel = stride =
p computes exactly that, and unlike `extract_patches` its gradient compiles
under XLA on every device. The kernel is HWIO, as `embedding/kernel` in the
official checkpoints. With `patch_size=1` the layer projects each position of
a CNN feature map (the hybrid models of Section 3.1).
"""

import keras
from keras import ops

from keras_vit.checks import check_bool, to_pair


@keras.saving.register_keras_serializable(package="keras_vit")
class PatchEmbedding(keras.layers.Layer):
    """Projects non-overlapping patches to `hidden_size` features.

    Args:
        patch_size: int or (int, int). Patch height and width. Defaults to 16.
        hidden_size: int. Width of each patch embedding. Defaults to 768.
        kernel_initializer: initializer for the `(p, p, channels, hidden)`
            kernel. Defaults to `"lecun_normal"` (Flax's default).
        bias_initializer: initializer for the bias. Defaults to `"zeros"`.
        use_bias: bool. Whether the projection has a bias (CLIP's has
            none). Defaults to True.

    Call arguments:
        inputs: `(batch, height, width, channels)` images or feature maps, of
            any real or integer dtype (integers are cast, not rescaled).

    Returns:
        `(batch, height // p, width // p, hidden_size)` patch embeddings.

    Example:
    >>> layer = PatchEmbedding(patch_size=8, hidden_size=16)
    >>> tuple(layer(np.zeros((2, 32, 48, 3))).shape)
    (2, 4, 6, 16)
    """

    def __init__(
        self,
        patch_size=16,
        hidden_size=768,
        kernel_initializer="lecun_normal",
        bias_initializer="zeros",
        use_bias=True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.patch_size = to_pair(patch_size, "patch_size")
        if hidden_size is None or int(hidden_size) < 1:
            raise ValueError(
                f"`hidden_size` must be a positive integer; received hidden_size={hidden_size}"
            )
        self.hidden_size = int(hidden_size)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.use_bias = check_bool(use_bias, "use_bias")

    def build(self, input_shape):
        if len(input_shape) != 4:
            raise ValueError(
                "PatchEmbedding expects images of rank 4 (batch, height, width, "
                f"channels); received input_shape={tuple(input_shape)}"
            )
        self._check_divisible(input_shape)
        channels = input_shape[-1]
        if channels is None:
            raise ValueError(
                "The number of input channels must be known; "
                f"received input_shape={tuple(input_shape)}"
            )
        # Later calls with other channels fail with Keras' expected/received message.
        self.input_spec = keras.layers.InputSpec(ndim=4, axes={-1: channels})
        self.kernel = self.add_weight(
            name="kernel",
            shape=(*self.patch_size, channels, self.hidden_size),
            initializer=self.kernel_initializer,
        )
        self.bias = None
        if self.use_bias:
            self.bias = self.add_weight(
                name="bias", shape=(self.hidden_size,), initializer=self.bias_initializer
            )

    def _check_divisible(self, shape):
        for size, patch, axis in zip(shape[1:3], self.patch_size, ("height", "width"), strict=True):
            if size is not None and size % patch:
                raise ValueError(
                    f"The image {axis} must be divisible by `patch_size`={self.patch_size}; "
                    f"received input_shape={tuple(shape)}"
                )

    def _checked_when_run(self, inputs):
        """`inputs`, refused when they run if a size unknown while tracing is no multiple of the patch.

        Otherwise the VALID convolution would drop the remainder without a word
        (dynamic_image_size in a traced TensorFlow function, a SavedModel). The
        graph asserts, naming the sizes; XLA compiles asserts away, so the
        inputs also pass a reshape to the sizes rounded down to whole patches,
        which is the identity when they divide and an error when they do not.
        """
        if None not in inputs.shape[1:3] or keras.backend.backend() != "tensorflow":
            return inputs  # JAX traces every size it runs: `_check_divisible` has seen it
        import tensorflow as tf

        sizes = tf.shape(inputs)[1:3]
        whole = sizes // self.patch_size * self.patch_size
        check = tf.debugging.Assert(tf.reduce_all(tf.equal(sizes, whole)), [
            f"The image height and width must be divisible by `patch_size`={self.patch_size}; received", sizes])
        with tf.control_dependencies([check]):
            return tf.reshape(inputs, tf.concat([tf.shape(inputs)[:1], whole, tf.shape(inputs)[3:]], 0))

    def call(self, inputs):
        self._check_divisible(inputs.shape)
        empty = self.compute_output_shape(inputs.shape)
        if empty[0] == 0 and None not in empty:
            # TensorFlow's Conv2D returns an empty batch (0 images) unchanged, in the images' shape. Decided
            # while tracing, so the graph of any other batch is untouched (a reshape there changed bfloat16
            # rounding by keeping the convolution and its bias apart).
            return ops.zeros(empty, self.compute_dtype)
        inputs = ops.cast(self._checked_when_run(inputs), self.compute_dtype)
        patches = ops.conv(inputs, self.kernel, strides=self.patch_size, padding="valid")
        return patches if self.bias is None else patches + self.bias

    def compute_output_shape(self, input_shape):
        grid = [
            None if size is None else size // patch
            for size, patch in zip(input_shape[1:3], self.patch_size, strict=True)
        ]
        return (input_shape[0], *grid, self.hidden_size)

    def get_config(self):
        return {
            **super().get_config(),
            "patch_size": self.patch_size,
            "hidden_size": self.hidden_size,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            "use_bias": self.use_bias,
        }
