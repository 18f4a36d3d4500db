"""keras_vit: the Vision Transformer as Keras 3 layers and builders."""

from keras_vit._version import __version__
from keras_vit._clash import warn_if_shadowed
from keras_vit import analysis, layers, pretrained
from keras_vit.analysis import (
    attention_maps,
    attention_rollout,
    embedding_filter_components,
    intermediates,
    mean_attention_distance,
    position_embedding_similarity,
    rollout_map,
)
from keras_vit.config import ViTConfig
from keras_vit.checkpoints import config_from_checkpoint, load_checkpoint, load_npz, save_npz
from keras_vit.imagenet import decode_predictions
from keras_vit.model import (
    DeiT_B16,
    DeiT_S16,
    DeiT_Ti16,
    R26_ViT_B32,
    R26_ViT_S32,
    R50_ViT_B16,
    R50_ViT_L32,
    R_ViT_Ti16,
    ViT,
    ViTModel,
    ViT_B8,
    ViT_B16,
    ViT_B32,
    ViT_H14,
    ViT_L16,
    ViT_L32,
    ViT_S16,
    ViT_S32,
    ViT_Ti16,
)
from keras_vit.preprocessing import preprocess_input, resize_and_center_crop
from keras_vit.variants import decode_variant

warn_if_shadowed()
