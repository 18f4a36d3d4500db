"""The encoder's blocks as one loop over weights stacked on a layer axis.

`ViT(scan_layers=True)` puts this layer where `num_layers` `EncoderBlock`s
would be. The math is `EncoderBlock`'s, run once per block on that block's
slice of the stacked weights, so XLA compiles one block instead of every
block, and an optimizer updates one variable per kind of weight instead of
one per block, which cuts the first XLA call and training step
(docs/performance.md). big_vision's ViT has the same option
(`scan`). Official checkpoints load into it as into the unrolled model.
"""

import keras
from keras import ops

from keras_vit.layers.drop_path import linear_rate
from keras_vit.layers.encoder_block import EncoderBlock
from keras_vit.layers.initializers import fresh_copy

# Draws a block makes from one seed generator per call, at most.
_DRAWS_PER_GENERATOR = 2


class _PerBlock(keras.initializers.Initializer):
    """Stacks `num` independent draws of a block weight's own initializer.

    Each block draws from a fresh copy (`fresh_copy`), as each unrolled block
    would.
    """

    def __init__(self, initializer, num):
        self.initializer = initializer
        self.num = num

    def __call__(self, shape, dtype=None):
        copies = [fresh_copy(self.initializer) for _ in range(self.num)]
        return ops.stack([copy(shape[1:], dtype=dtype) for copy in copies])


def _unallocated_build(layer, input_shape):
    """Builds `layer` with variables that hold no memory; returns its trainable variables' initializers.

    The variables only name the slices fed to the layer's `stateless_call`.
    Keras offers no public way to keep a variable unallocated nor to read its
    initializer, so this function is the one place that relies on Keras
    internals (keras/src/backend/common/variables.py; checked on the installed
    version by test_the_keras_internals_of_unallocated_build_still_hold):
    - a variable made in `keras.StatelessScope(initialize_variables=False)`
      has no value, keeps its initializer in `variable._initializer`, and
      waits in the global list "uninitialized_variables" until an
      initialising scope closes;
    - taken off that list, it stays without a value.
    """
    from keras.src.backend.common import global_state

    with keras.StatelessScope(initialize_variables=False):
        layer.build(input_shape)
    own = {id(v) for v in layer.weights}
    pending = global_state.get_global_attribute("uninitialized_variables") or []
    global_state.set_global_attribute("uninitialized_variables", [v for v in pending if id(v) not in own])
    return [v._initializer for v in layer.trainable_variables]


def _path_in_block(variable, block):
    """`norm_1/gamma` of `encoder/block/norm_1/gamma`: the path below `block`."""
    return f"/{variable.path}".rpartition(f"/{block.name}/")[2]


@keras.saving.register_keras_serializable(package="keras_vit")
class ScannedEncoder(keras.layers.Layer):
    """`num_layers` encoder blocks with stacked weights, run by one loop.

    Each weight of `EncoderBlock` is held once with a leading axis of
    `num_layers` and named by its path in the block, `/` written `.`
    (`attention.query_kernel` is `(num_layers, D, heads, head_dim)`).
    While training, each block draws its own dropout masks, and its
    stochastic depth rises linearly to `drop_path_rate` at the last block,
    as in the unrolled model.

    Args:
        num_layers: int. Encoder blocks.
        block_config: dict. The arguments of `EncoderBlock` for every block
            (`num_heads`, `mlp_dim`, ...); its `drop_path_rate` is the last
            block's.

    Call arguments:
        inputs: `(batch, tokens, width)`.
        training: bool.

    Returns:
        `(batch, tokens, width)`.

    Example:
    >>> encoder = ScannedEncoder(3, {"num_heads": 2, "mlp_dim": 32})
    >>> tuple(encoder(np.zeros((2, 5, 8))).shape)
    (2, 5, 8)
    """

    def __init__(self, num_layers, block_config, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"`num_layers` must be a positive int; received num_layers={num_layers!r}")
        self.num_layers = num_layers
        self.block_config = dict(block_config)
        self.drop_path_rate = float(self.block_config.get("drop_path_rate", 0.0))

    def build(self, input_shape):
        block = EncoderBlock(**self.block_config, dtype=self.dtype_policy, name="block")
        initializers = _unallocated_build(block, input_shape)
        # Only the block's call is kept: Keras would track, save and load the block itself.
        self._run_block = block.stateless_call
        # The block's non-trainable state is the seeds of its random layers, fed anew to each block
        # from one generator of this layer's (none if the block draws nothing).
        self._seed_dtypes = [v.dtype for v in block.non_trainable_variables]
        self.seed_generator = keras.random.SeedGenerator() if self._seed_dtypes else None
        self.stacked = [
            self.add_weight(
                name=_path_in_block(v, block).replace("/", "."),
                shape=(self.num_layers, *v.shape),
                initializer=_PerBlock(initializer, self.num_layers),
                dtype=v.dtype,
            )
            for v, initializer in zip(block.trainable_variables, initializers)
        ]

    def template_block(self):
        """The `EncoderBlock` each step calls with one block's weights.

        A method, not an attribute: Keras would track, save and load an attribute's layer.
        """
        return self._run_block.__self__

    def call(self, inputs, training=None):
        seed = self.seed_generator.next() if training and self.seed_generator else None

        def run_block(i, x):
            weights = [ops.take(w, i, axis=0) for w in self.stacked]
            drop_path_rate = None
            if self.drop_path_rate:
                drop_path_rate = linear_rate(self.drop_path_rate, ops.cast(i, "float32"), self.num_layers)
            outputs, _ = self._run_block(
                weights, self._block_seeds(seed, i), x, training=training, drop_path_rate=drop_path_rate
            )
            return outputs

        if training and inputs.shape[0] is None:
            # XLA differentiates the loop only with static shapes (a batch of
            # unknown size hides them), so such a batch runs the blocks unrolled.
            for i in range(self.num_layers):
                inputs = run_block(i, inputs)
            return inputs
        if keras.backend.backend() == "tensorflow":
            import tensorflow as tf

            # XLA differentiates a while loop only with a bound on its trips.
            return tf.while_loop(
                lambda i, x: i < self.num_layers,
                lambda i, x: (i + 1, run_block(i, x)),
                (0, inputs),
                maximum_iterations=self.num_layers,
            )[1]
        return ops.fori_loop(0, self.num_layers, run_block, inputs)

    def _block_seeds(self, seed, i):
        """Block `i`'s seed for each of its seed generators, drawn from this call's `seed`.

        Seeds differ in their first half between blocks and generators, and
        in their second between calls, spaced by the draws a block makes
        from one generator (the MLP's dropout and the stochastic depth draw
        twice), so no two draws of a training run share a seed.
        """
        if seed is None:  # not training: the block draws nothing
            return [ops.zeros((2,), dtype) for dtype in self._seed_dtypes]
        count = len(self._seed_dtypes)
        first = seed[0] + ops.cast(i, seed.dtype) * count
        return [ops.stack([first + k + 1, seed[1] * _DRAWS_PER_GENERATOR]) for k in range(count)]

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "num_layers": self.num_layers, "block_config": self.block_config}
