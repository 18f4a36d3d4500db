"""The encoder of a built keras_vit model, walked block by block on its own graph.

The analyses need what each block gives: its output tokens and its attention
weights. `block_outputs` takes them from the model's own graph, so the Keras
models built on it share the model's weights (nothing is copied, and they
follow the model when it trains):
- an unrolled model's block outputs are its own tensors (`block.output`);
- attention weights come from each block run again, with
  `return_attention_scores=True`, inside a fresh view layer (`SharedBlock`):
  Keras (3.15) checks a functional model's connections against the outputs
  of a layer's *first* call, so a second call of the block itself with
  another output structure gives a model Keras refuses ("Output ... is not
  connected to `inputs`");
- a `ScannedEncoder` (`scan_layers=True`) runs its blocks in one loop and
  returns the last block's tokens only. `ScannedBlock` is a view of one of
  its blocks: `ScannedEncoder.call_block`, the encoder's own block
  computation on that block's slice of the stacked weights, as the loop runs it. So per-block outputs need no
  unrolled twin model and no weight copy.

The views hold another model's layers, so a model built with them exports
(`model.export`, `tf.function`) but is not saved as a `.keras` file.
"""

import keras

from keras_vit.layers.scanned_encoder import ScannedEncoder, block_name

_NOT_SAVED = ("{name} runs a block of another model on that model's weights and is not saved on its own: "
              "save the ViT, load it, and build the analysis model again (or export it with model.export)")


class SharedBlock(keras.layers.Layer):
    """A model's `EncoderBlock`, run at inference as a layer of another graph.

    Not saved on its own: it holds the block, whose weights stay the model's.

    Args:
        block: a built `EncoderBlock`.

    Call arguments:
        tokens: `(batch, tokens, width)`.
        return_attention_scores: bool. Also return the block's attention
            weights, `(batch, heads, tokens, tokens)`.
        coordinates: None, or the tokens' rotary coordinates (a
            `dynamic_image_size` model's run-time grid).
    """

    def __init__(self, block, **kwargs):
        super().__init__(**kwargs)
        self.block = block

    def call(self, tokens, return_attention_scores=False, coordinates=None):
        return self.block(tokens, training=False, return_attention_scores=return_attention_scores,
                          coordinates=coordinates)

    def get_config(self):
        raise NotImplementedError(_NOT_SAVED.format(name=self.name))


class ScannedBlock(keras.layers.Layer):
    """Block `index` of a `ScannedEncoder`, at inference, on the encoder's own weights.

    Not saved on its own: it holds the encoder, whose weights stay the
    model's.

    Args:
        encoder: a built `ScannedEncoder`.
        index: int. The block, in `[0, encoder.num_layers)`.

    Call arguments:
        tokens: `(batch, tokens, width)`.
        return_attention_scores: bool. Also return the block's attention
            weights, `(batch, heads, tokens, tokens)`.
        coordinates: None, or the tokens' rotary coordinates.
    """

    def __init__(self, encoder, index, **kwargs):
        super().__init__(**kwargs)
        self.encoder = encoder
        self.index = int(index)

    def call(self, tokens, return_attention_scores=False, coordinates=None):
        return self.encoder.call_block(self.index, tokens, return_attention_scores=return_attention_scores,
                                       coordinates=coordinates)

    def get_config(self):
        raise NotImplementedError(_NOT_SAVED.format(name=self.name))


def encoder_layers(model):
    """The model's `EncoderBlock`s in order, or its one `ScannedEncoder` in a list."""
    check_model(model)
    names = {layer.name: layer for layer in model.layers}
    if "encoder" in names and isinstance(names["encoder"], ScannedEncoder):
        return [names["encoder"]]
    blocks = []
    while block_name(len(blocks)) in names:
        blocks.append(names[block_name(len(blocks))])
    return blocks


def num_blocks(model):
    """How many encoder blocks the model runs."""
    layers = encoder_layers(model)
    return layers[0].num_layers if isinstance(layers[0], ScannedEncoder) else len(layers)


def block_outputs(model, return_attention_scores=False):
    """Each block's output tokens (and attention weights) as Keras tensors of the model's graph.

    Returns:
        A list with one entry per block: its `(batch, tokens, width)` output,
        or a pair `(output, (batch, heads, tokens, tokens) weights)`.
    """
    layers = encoder_layers(model)
    scanned = isinstance(layers[0], ScannedEncoder)
    if not (scanned or return_attention_scores):
        return [block.output for block in layers]  # the model's own tensors: a .keras file can hold them
    # The embedded sequence, as the model computed it, beside the rotary coordinates of a run-time grid (floats;
    # PatchDropout's int token places are every place in order at inference, which the blocks need not be told).
    tokens, *others = keras.tree.flatten(layers[0].input)
    coordinates = next((t for t in others if "float" in str(t.dtype)), None)
    if scanned:
        views = [ScannedBlock(layers[0], i, name=block_name(i)) for i in range(layers[0].num_layers)]
    else:
        views = [SharedBlock(block, name=block.name) for block in layers]
    outputs = []
    for view in views:
        result = view(tokens, return_attention_scores=return_attention_scores, coordinates=coordinates)
        tokens = result[0] if return_attention_scores else result
        outputs.append(result)
    return outputs


def num_prefix_tokens(model):
    """Tokens before the patches (class token, distillation token): as the model assembles its sequence."""
    return model.get_layer("position_embedding").num_prefix_tokens


def check_model(model):
    """A ValueError unless `model` is a keras_vit ViT (its named layers are the contract)."""
    if not isinstance(model, keras.Model):
        raise TypeError(f"`model` must be a keras_vit ViT model (keras.Model); received {type(model).__name__}")
    names = {layer.name for layer in model.layers}
    missing = [name for name in ("patch_embedding", "position_embedding") if name not in names]
    if missing or not ({"encoder", block_name(0)} & names):
        raise ValueError(
            "`model` must be a keras_vit ViT: layers 'patch_embedding', 'position_embedding' and "
            f"{block_name(0)!r}... or 'encoder'; received model {model.name!r} with layers {sorted(names)}"
        )
