"""Masked patch prediction (Dosovitskiy et al., 2021, Sec. 4.6 and Appendix B.1.2): the pre-training network.

`mpp_network(config)` is the ViT with its patch embeddings corrupted
(`layers.PatchCorruption`: 50% chosen; of those 80% masked, 10% another
patch, 10% kept) and a head `mpp_head` that predicts, from every patch's
output token, the patch's mean colour in 3 bits per channel (512 classes
for RGB). `colour_targets` computes those classes from the images, and
`backbone(network)` is the plain headless ViT with the pre-trained weights,
the model that `save_npz` writes and the fine-tuning recipes load.
"""

import keras
import numpy as np
from keras import ops

from keras_vit import model as vit_model
from keras_vit.layers import PatchCorruption
from keras_vit.preprocessing import inputs_to_pixels

BITS = 3


def colour_classes(channels):
    """Classes of the 3-bit mean colour: 8 levels per channel (512 for RGB, 8 for grey)."""
    return (2**BITS) ** channels


def colour_targets(images, config):
    """Each patch's 3-bit mean colour as one class, `(batch, patches)` int32 in row-major patch order.

    Args:
        images: `(batch, height, width, channels)` model inputs, normalised as `config` says
            (`preprocess_input(pixels, config=config)`); height and width multiples of the patch size.
        config: the `ViTConfig` of the model (its patch size, mean and std).

    The pixels are recovered in [0, 1], averaged over each patch, and each channel's mean is put in one of 8
    equal bins; the class is the bins read as a base-8 number, the first channel most significant.
    """
    channels = config.channels
    pixels = inputs_to_pixels(images, config) / 255.0
    patch_height, patch_width = config.patch_size
    shape = ops.shape(pixels)
    grid = (shape[1] // patch_height, shape[2] // patch_width)
    patches = ops.reshape(pixels, (shape[0], grid[0], patch_height, grid[1], patch_width, channels))
    means = ops.mean(patches, axis=(2, 4))
    levels = ops.cast(ops.clip(ops.floor(means * 2**BITS), 0, 2**BITS - 1), "int32")
    weights = np.array([(2**BITS) ** (channels - 1 - c) for c in range(channels)], "int32")
    return ops.reshape(ops.sum(levels * weights, axis=-1), (shape[0], -1))


def mpp_network(config, input_shape=None, seed=None, name="vit_mpp"):
    """The masked-patch-prediction network of `config` (a `ViTConfig`; its head fields are ignored).

    Returns:
        A `ViTModel` from images to `{"logits": (batch, patches, colour_classes), "chosen": (batch, patches)}`,
        `chosen` 1 for the corrupted patches (the prediction targets). Its layers are named as the ViT's, so
        `backbone(network)` carries them over.
    """
    config = vit_model.resolve_config(config, {}, input_shape).replace(classes=0)
    if config.resnet_num_layers is not None:
        raise ValueError("Masked patch prediction corrupts pixel patches, which a hybrid's ResNet stem mixes; "
                         f"received resnet_num_layers={config.resnet_num_layers}: use a plain ViT")
    if config.patch_dropout:
        raise ValueError("Masked patch prediction predicts every patch from its output token, and PatchDropout "
                         f"drops tokens; received patch_dropout={config.patch_dropout}: use patch_dropout=0")
    inputs, images = vit_model.image_input(config)
    corrupted, chosen = PatchCorruption(seed=seed, name="patch_corruption")(vit_model.patch_grid(config, images))
    tokens = vit_model.encode(config, vit_model.token_sequence(config, corrupted),
                              vit_model.rotary_coordinates(config, corrupted))
    norm_name = "mpp_norm" if config.fc_norm else "encoder_norm"  # with fc_norm the ViT norms after pooling
    tokens = keras.layers.LayerNormalization(epsilon=config.layer_norm_epsilon, name=norm_name)(tokens)
    patch_tokens = tokens[:, config.num_prefix_tokens:]
    logits = keras.layers.Dense(colour_classes(config.channels), kernel_initializer="zeros",
                                dtype=keras.mixed_precision.dtype_policy().variable_dtype,
                                name="mpp_head")(patch_tokens)
    chosen = keras.layers.Reshape((-1,), name="chosen_patches")(chosen)
    return vit_model.ViTModel(inputs, {"logits": logits, "chosen": chosen}, vit_config=config, name=name)


def backbone(network, name="vit"):
    """The headless ViT of an MPP `network`, holding its pre-trained weights (not the mask or the MPP head).

    Layers MPP does not train, which act on the pooled vector (`fc_norm`, `pre_logits`), start as initialised.
    """
    model = vit_model.ViT(network.vit_config, include_top=False, name=name)
    trained = {layer.name for layer in network.layers}
    for layer in model.layers:
        if layer.weights and layer.name in trained:
            layer.set_weights(network.get_layer(layer.name).get_weights())
    return model
