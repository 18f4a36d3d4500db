"""The encoder's blocks as one loop over weights stacked on a layer axis.

`ViT(scan_layers=True)` puts this layer where `num_layers` `EncoderBlock`s
would be. The math is `EncoderBlock`'s, run once per block on that block's
slice of the stacked weights, so XLA compiles one block instead of every
block, and an optimizer updates one variable per kind of weight instead of
one per block, which cuts the first XLA call and training step
(docs/performance.md). big_vision's ViT has the same option
(`scan`). Official checkpoints load into it as into the unrolled model.

Checkpoints, analysis, export and tests reach the blocks through its block
API, never its internals: `block_name(i)` and `unrolled_weights()` (the
unrolled model's weight paths), `block_weight_paths()`, `block_weights(i)`,
`call_block(i, tokens)`, and `ScannedEncoder.stack(blocks)` / `unstack()`
between `EncoderBlock`s and stacked weights.
"""

import numbers

import keras
import numpy as np
from keras import ops

from keras_vit.layers.drop_path import linear_rate
from keras_vit.layers.encoder_block import EncoderBlock
from keras_vit.layers.initializers import fresh_copy
from keras_vit.layers.keras_internals import unallocated_build

# Joins a block weight's path into its stacked weight's name (`mlp-dense_1-kernel`): a Keras name holds no "/",
# and Keras' PyTorch backend registers every variable as a torch parameter named by its path, which holds no ".".
NAME_SEPARATOR = "-"
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


def block_name(index):
    """The name the unrolled model gives block `index` (`encoder_block_3`), under which checkpoints keep its weights."""
    return f"encoder_block_{index}"


def _block_config(block):
    """`block`'s constructor arguments of its own (not the base layer's: name, dtype, trainable)."""
    base = keras.layers.Layer.get_config(block)
    return {key: value for key, value in block.get_config().items() if key not in base}


def _path_in_block(variable, block):
    """`norm_1/gamma` of `encoder/block/norm_1/gamma`: the path below `block`."""
    return f"/{variable.path}".rpartition(f"/{block.name}/")[2]


@keras.saving.register_keras_serializable(package="keras_vit")
class ScannedEncoder(keras.layers.Layer):
    """`num_layers` encoder blocks with stacked weights, run by one loop.

    Each weight of `EncoderBlock` is held once with a leading axis of
    `num_layers` and named by its path in the block, `/` written `.`
    (`attention-query_kernel` is `(num_layers, D, heads, head_dim)`).
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
        coordinates, token_indices: passed to every block (`EncoderBlock`).

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
        initializers = unallocated_build(block, input_shape)
        # Only the block's call is kept: Keras would track, save and load the block itself.
        self._run_block = block.stateless_call
        # The block's non-trainable state is the seeds of its random layers, fed anew to each block
        # from one generator of this layer's (none if the block draws nothing).
        self._seed_dtypes = [v.dtype for v in block.non_trainable_variables]
        self.seed_generator = keras.random.SeedGenerator() if self._seed_dtypes else None
        self.stacked = [
            self.add_weight(
                name=_path_in_block(v, block).replace("/", NAME_SEPARATOR),
                shape=(self.num_layers, *v.shape),
                initializer=_PerBlock(initializer, self.num_layers),
                dtype=v.dtype,
            )
            for v, initializer in zip(block.trainable_variables, initializers, strict=True)
        ]

    def template_block(self):
        """The `EncoderBlock` each step calls with one block's weights.

        A method, not an attribute: Keras would track, save and load an attribute's layer.
        """
        return self._run_block.__self__

    def block_weight_paths(self):
        """Each stacked weight's path in one block (`mlp/dense_1/kernel`), in the order of `stacked`."""
        return [variable.name.replace(NAME_SEPARATOR, "/") for variable in self.stacked]

    def unrolled_weights(self):
        """`(path, variable, block)` for each stacked weight and block, `path` the unrolled model's.

        `path` is where block `block`'s slice of `variable` (its leading axis)
        lives in a model of `EncoderBlock`s: `encoder_block_3/mlp/dense_1/kernel`.
        """
        for variable, path_in_block in zip(self.stacked, self.block_weight_paths(), strict=True):
            for block in range(self.num_layers):
                yield f"{block_name(block)}/{path_in_block}", variable, block

    def block_weights(self, index):
        """Block `index`'s weights, `{path in block: numpy array}` (`{"mlp/dense_1/kernel": ...}`)."""
        index = self._check_index(index)
        return {path: ops.convert_to_numpy(variable[index])
                for variable, path in zip(self.stacked, self.block_weight_paths(), strict=True)}

    def call_block(self, index, tokens, training=False, return_attention_scores=False, coordinates=None,
                   token_indices=None):
        """Block `index` alone on `tokens`: `EncoderBlock`'s call on that block's weights, as the loop runs it.

        Args:
            index: int in `[0, num_layers)`.
            tokens: `(batch, tokens, width)`.
            training: bool. Draws the block's dropout and its stochastic
                depth (its linear share of `drop_path_rate`) from this
                layer's seed generator. Defaults to False.
            return_attention_scores: bool. Also return the block's attention
                weights, `(batch, heads, tokens, tokens)`. Defaults to False.
            coordinates: None, or the tokens' rotary coordinates (a
                `dynamic_image_size` model's grid).
            token_indices: None, or each token's place in the full
                sequence (`PatchDropout`'s kept tokens).

        Returns:
            `(batch, tokens, width)`, and the attention weights if asked for.
        """
        index = self._check_index(index)
        seed = self.seed_generator.next() if training and self.seed_generator else None
        return self._block(index, tokens, seed, training, return_attention_scores, coordinates, token_indices)

    def load_blocks(self, blocks):
        """Sets the stacked weights to those of `blocks`: `num_layers` built `EncoderBlock`s, in order."""
        blocks = list(blocks)
        if len(blocks) != self.num_layers or not all(isinstance(b, EncoderBlock) and b.built for b in blocks):
            raise ValueError(f"`blocks` must be {self.num_layers} built EncoderBlocks; received "
                             f"{[type(b).__name__ for b in blocks]}")
        paths = self.block_weight_paths()
        per_block = [{_path_in_block(v, block): v for v in block.weights} for block in blocks]
        for block, weights in zip(blocks, per_block, strict=True):
            if sorted(weights) != sorted(paths):
                raise ValueError(f"The block {block.name!r} has the weights {sorted(weights)}; this encoder's "
                                 f"blocks have {sorted(paths)}")
            for variable, path in zip(self.stacked, paths, strict=True):
                if tuple(weights[path].shape) != tuple(variable.shape[1:]):
                    raise ValueError(f"The block {block.name!r} has {path!r} of shape {tuple(weights[path].shape)}; "
                                     f"this encoder's blocks have {tuple(variable.shape[1:])}")
        for variable, path in zip(self.stacked, paths, strict=True):
            variable.assign(np.stack([ops.convert_to_numpy(weights[path]) for weights in per_block]))

    @classmethod
    def stack(cls, blocks, name="encoder"):
        """A built `ScannedEncoder` holding `blocks`' weights: an unrolled encoder as one loop.

        Args:
            blocks: built `EncoderBlock`s of one configuration whose
                stochastic depth rises linearly to the last block's, as
                `ViT` builds them.
            name: str. The layer's name. Defaults to `"encoder"`.
        """
        blocks = list(blocks)
        if not blocks or not all(isinstance(b, EncoderBlock) and b.built for b in blocks):
            raise ValueError(f"`blocks` must be built EncoderBlocks; received {[type(b).__name__ for b in blocks]}")
        configs = [_block_config(block) for block in blocks]
        rates = [config.pop("drop_path_rate") for config in configs]
        differing = sorted({key for config in configs for key in config if config[key] != configs[0].get(key)})
        if differing:
            raise ValueError(f"`blocks` must share one configuration; they differ in {differing}")
        linear = [linear_rate(rates[-1], i, len(blocks)) for i in range(len(blocks))]
        if not np.allclose(rates, linear):
            raise ValueError("A ScannedEncoder's stochastic depth rises linearly to the last block's; received "
                             f"blocks with drop_path_rate {rates}, expected {linear}")
        encoder = cls(len(blocks), {**configs[0], "drop_path_rate": rates[-1]}, dtype=blocks[0].dtype_policy,
                      name=name)
        encoder.build((None, None, blocks[0].norm_1.gamma.shape[-1]))
        encoder.load_blocks(blocks)
        return encoder

    def unstack(self):
        """The blocks as built `EncoderBlock`s, named as the unrolled model names them, with copies of their weights.

        Each has its linear share of `drop_path_rate`, so they compute what
        this layer computes, in training too.
        """
        config = {key: value for key, value in self.block_config.items() if key != "drop_path_rate"}
        width = self.template_block().norm_1.gamma.shape[-1]
        blocks = []
        for i in range(self.num_layers):
            block = EncoderBlock(**config, drop_path_rate=linear_rate(self.drop_path_rate, i, self.num_layers),
                                 dtype=self.dtype_policy, name=block_name(i))
            block.build((None, None, width))
            weights = self.block_weights(i)
            for variable in block.weights:
                variable.assign(weights[_path_in_block(variable, block)])
            blocks.append(block)
        return blocks

    def _check_index(self, index):
        if not isinstance(index, numbers.Integral) or isinstance(index, bool) or not 0 <= index < self.num_layers:
            raise ValueError(f"`index` must be a block number in [0, {self.num_layers}); received index={index!r}")
        return int(index)

    def _block(self, i, x, seed, training, return_attention_scores=False, coordinates=None, token_indices=None):
        """Block `i` (an int or a scalar tensor) on `x`: the loop's body."""
        weights = [ops.take(w, i, axis=0) for w in self.stacked]
        drop_path_rate = None
        if self.drop_path_rate:
            drop_path_rate = linear_rate(self.drop_path_rate, ops.cast(i, "float32"), self.num_layers)
        outputs, _ = self._run_block(weights, self._block_seeds(seed, i), x, training=training,
                                     return_attention_scores=return_attention_scores, drop_path_rate=drop_path_rate,
                                     coordinates=coordinates, token_indices=token_indices)
        return outputs

    def call(self, inputs, training=None, coordinates=None, token_indices=None):
        seed = self.seed_generator.next() if training and self.seed_generator else None

        def run_block(i, x):
            return self._block(i, x, seed, training, coordinates=coordinates, token_indices=token_indices)

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

    def compute_output_spec(self, inputs, training=None, coordinates=None, token_indices=None):
        return keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)

    def get_config(self):
        return {**super().get_config(), "num_layers": self.num_layers, "block_config": self.block_config}
