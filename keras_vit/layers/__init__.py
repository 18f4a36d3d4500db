"""The layers of the Vision Transformer, one concept per module."""

from keras_vit.layers.attention import MultiHeadSelfAttention
from keras_vit.layers.class_token import ClassToken
from keras_vit.layers.distillation_token import DistillationToken
from keras_vit.layers.drop_path import DropPath
from keras_vit.layers.encoder_block import EncoderBlock, Mlp
from keras_vit.layers.layer_scale import LayerScale
from keras_vit.layers.map_head import MAPHead
from keras_vit.layers.patch_corruption import PatchCorruption
from keras_vit.layers.patch_dropout import PatchDropout
from keras_vit.layers.patch_embedding import PatchEmbedding
from keras_vit.layers.pooling import SequencePooling
from keras_vit.layers.position_embedding import PositionEmbedding
from keras_vit.layers.register_tokens import RegisterTokens
from keras_vit.layers.resnet_stem import ResidualUnit, ResNetStem, StdConv2D
from keras_vit.layers.rotary_coordinates import RotaryCoordinates
from keras_vit.layers.scanned_encoder import ScannedEncoder
