"""See inside a ViT: intermediate tokens, attention maps and rollout, attention
distance, position-embedding similarity and patch-filter components.

The analyses of Dosovitskiy et al. (2021), Section 4.5 and Figures 6-7, for
any keras_vit model as built (unrolled or scanned encoder, token or GAP
classifier, any resolution with `dynamic_image_size`). One concept per module:
- `blocks`: the encoder walked block by block on the model's own graph;
- `intermediates`: a Keras model of chosen blocks' tokens or patch grids;
- `attention`: every block's attention weights, attention rollout;
- `distance`: mean attention distance per head;
- `embeddings`: position-embedding similarity, patch-filter components.
"""

from keras_vit.analysis.attention import attention_maps, attention_rollout, rollout_map
from keras_vit.analysis.distance import mean_attention_distance
from keras_vit.analysis.embeddings import embedding_filter_components, position_embedding_similarity
from keras_vit.analysis.intermediates import PatchTokenGrid, SplitPrefixTokens, intermediates

__all__ = [
    "PatchTokenGrid",
    "SplitPrefixTokens",
    "attention_maps",
    "attention_rollout",
    "embedding_filter_components",
    "intermediates",
    "mean_attention_distance",
    "position_embedding_similarity",
    "rollout_map",
]
