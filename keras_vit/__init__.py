"""keras_vit: the Vision Transformer as Keras 3 layers and builders.

`import keras_vit` loads neither Keras nor TensorFlow: each public name is imported from its module on first
use (`keras_vit.ViT_B16`, `from keras_vit import ViT_B16`), so `keras_vit.config` and `keras_vit.variants`
serve command lines that check their flags before TensorFlow starts. The Keras classes register for
`keras.models.load_model` as soon as Keras is imported (`keras_vit._registration`).
"""

import importlib
import importlib.util

from keras_vit._clash import warn_if_shadowed
from keras_vit._onednn import prefer_onednn
from keras_vit._registration import register_with_keras
from keras_vit._version import __version__

# Each public name and the module it comes from; a module's own name stands for the module.
_SOURCES = {
    "keras_vit.analysis": ("attention_maps", "attention_rollout", "embedding_filter_components", "intermediates",
                           "mean_attention_distance", "position_embedding_similarity", "rollout_map"),
    "keras_vit.checkpoints": ("config_from_checkpoint", "load_checkpoint", "load_npz", "save_npz", "save_timm",
                              "save_transformers"),
    "keras_vit.config": ("ViTConfig",),
    "keras_vit.families": ("CLIP_B16", "CLIP_B32", "CLIP_L14", "DINOv2_B14", "DINOv2_G14", "DINOv2_L14", "DINOv2_S14",
                           "DINOv3_B16", "DINOv3_H16Plus", "DINOv3_L16", "DINOv3_S16", "DINOv3_S16Plus", "DeiT3_B16",
                           "DeiT3_H14", "DeiT3_L16", "DeiT3_M16", "DeiT3_S16", "EVA02_B14", "EVA02_L14", "EVA02_S14",
                           "EVA02_Ti14"),
    "keras_vit.imagenet": ("decode_predictions",),
    "keras_vit.model": ("DeiT_B16", "DeiT_S16", "DeiT_Ti16", "R26_ViT_B32", "R26_ViT_S32", "R50_ViT_B16",
                        "R50_ViT_L32", "R_ViT_Ti16", "ViT", "ViTModel", "ViT_B8", "ViT_B16", "ViT_B32", "ViT_H14",
                        "ViT_L16", "ViT_L32", "ViT_S16", "ViT_S32", "ViT_Ti16"),
    "keras_vit.preprocessing": ("preprocess_input", "resize_and_center_crop"),
    "keras_vit.saving": ("load_model",),
    "keras_vit.trim": ("head_tokens", "trim_last_block"),
    "keras_vit.variants": ("decode_variant",),
}
_MODULES = {"analysis": "keras_vit.analysis", "layers": "keras_vit.layers",
            "pretrained": "keras_vit.checkpoints.pretrained"}
_LAZY = {**{name: module for module, names in _SOURCES.items() for name in names}, **_MODULES}

__all__ = sorted([*_LAZY, "__version__", "warn_if_shadowed"])


def __getattr__(name):
    if name in _MODULES:
        value = importlib.import_module(_MODULES[name])
    elif name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    elif not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")  # a submodule, as `import keras_vit.NAME` gives
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted({*globals(), *_LAZY})


prefer_onednn()  # before anything loads TensorFlow, which reads it once
register_with_keras()
warn_if_shadowed()
