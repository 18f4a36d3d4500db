"""Rotary position embeddings (RoPE): queries and keys turned by angles set by each token's place.

Every variant is one rule. A token at grid coordinates (y, x) turns channel
pair p of each head's query and key by the angle `y F[0, p] + x F[1, p]`,
with F a `(2, head_dim / 2)` frequency matrix (one per head and block for
`"rope_mixed"`, learned). Prefix tokens (class, registers) sit at (0, 0):
angle 0, left as they are, as every reference leaves them. Values are never
turned. The kinds differ in three things:

- coordinates: patch indices (`"rope_axial"`, `"rope_mixed"`: Heo et al.
  2024, RoPE-ViT, which extrapolate to a larger grid), indices rescaled onto
  a reference grid (`"rope_eva"`: EVA02 stretches any grid onto the 16 x 16
  it was pretrained at) or patch centres in (-1, 1) (`"rope_dinov3"`: the
  same range at every resolution);
- frequencies: `theta ** (-k / (head_dim / 4))`, k < head_dim / 4, for one
  axis in the first quarter-pairs and the other axis in the rest (rows
  first in EVA02 and DINOv3, columns first in RoPE-ViT); DINOv3 writes
  them `2 pi / theta ** (4k / head_dim)`; RoPE-Mixed learns them;
- pairs: adjacent channels (2i, 2i + 1) (EVA02, RoPE-ViT) or the halves'
  channels (i, i + head_dim / 2) (DINOv3, timm's `rotate_half`).

The logits `q . k` are all that attention reads of the turned queries and
keys, and they do not change when q and k have their channels reordered
alike. So adjacent pairs are moved into halves before the turn: in the
query and key projections' weights (`halves_first`, a transpose of a
weight), where no norm sits between projection and turn, else in the
projected tokens by strided slices (which cost TensorFlow's CPU graph more
than a projection: docs/performance.md, "Rotary positions"). `rotate` then
turns the halves' channels, the same elementwise work for every kind.
"""

import math

import keras
import numpy as np
from keras import ops

# Name -> the theta its family uses (RoPE-Mixed's: of its initial frequencies).
THETAS = {"rope_axial": 100.0, "rope_mixed": 10.0, "rope_eva": 10000.0, "rope_dinov3": 100.0}
NAMES = tuple(THETAS)
# Weight name of the learned frequencies, `(2, heads, head_dim / 2)` per block: (y, x) rows.
FREQUENCIES = "rope_frequencies"


def check_head_dim(name, head_dim):
    """A ValueError unless `head_dim` splits into the quarter-pairs the kind `name` gives each axis."""
    if head_dim % 4:
        raise ValueError(f"rotary_embedding={name!r} turns head_dim / 4 channel pairs per axis: head_dim must be a "
                         f"multiple of 4; received head_dim={head_dim}")


def coordinates(name, grid_size, num_prefix_tokens, reference_grid=None):
    """`(prefix + rows * cols, 2)` (y, x) coordinates of the tokens, row-major; prefix rows (0, 0).

    `grid_size` holds ints (float64 numpy out) or scalar tensors (a
    `dynamic_image_size` model's grid: a float32 tensor out).
    """
    references = reference_grid or (None, None)
    if all(isinstance(n, int) for n in grid_size):
        y, x = (_axis(name, np.arange(n, dtype=np.float64), n, r) for n, r in zip(grid_size, references, strict=True))
        rows, cols = np.meshgrid(y, x, indexing="ij")
        patches = np.stack([rows.ravel(), cols.ravel()], axis=-1)
        return np.concatenate([np.zeros((num_prefix_tokens, 2)), patches])
    y, x = (_axis(name, ops.arange(n, dtype="float32"), ops.cast(n, "float32"), r)
            for n, r in zip(grid_size, references, strict=True))
    rows, cols = y[:, None] + 0 * x[None, :], x[None, :] + 0 * y[:, None]  # broadcast to the grid
    patches = ops.stack([ops.reshape(rows, (-1,)), ops.reshape(cols, (-1,))], axis=-1)
    return ops.concatenate([ops.zeros((num_prefix_tokens, 2)), patches], axis=0)


def _axis(name, index, size, reference):
    """One axis's coordinates from its patch indices `index` of `size`."""
    if name == "rope_dinov3":  # patch centres, in (-1, 1)
        return 2 * (index + 0.5) / size - 1
    if name == "rope_eva":  # stretched onto the reference grid
        return index / size * reference
    return index


def frequencies(name, head_dim, theta=None):
    """The fixed `(2, head_dim / 2)` frequency matrix of kind `name`, float64: row 0 turns by y, row 1 by x."""
    theta = THETAS[name] if theta is None else theta
    quarter = head_dim // 4
    k = np.arange(quarter, dtype=np.float64)
    bands = 2 * math.pi / theta ** (4 * k / head_dim) if name == "rope_dinov3" else theta ** (-k / quarter)
    zeros = np.zeros(quarter)
    by_row, by_col = np.concatenate([bands, zeros]), np.concatenate([zeros, bands])
    return np.stack([by_col, by_row] if name == "rope_axial" else [by_row, by_col])  # RoPE-ViT: columns first


def initial_frequencies(num_heads, head_dim, theta, seed=None):
    """RoPE-Mixed's starting `(2, heads, head_dim / 2)` (rows y, x): each head's bands along a random direction,
    then along the direction a right angle from it (Heo et al. 2024; timm's `init_random_2d_freqs`)."""
    bands = theta ** (-np.arange(0, head_dim, 4, dtype=np.float64) / head_dim)
    direction = np.random.default_rng(seed).uniform(0, 2 * math.pi, (num_heads, 1))
    turns = np.concatenate([direction + 0 * bands, direction + math.pi / 2 + 0 * bands], axis=-1)
    bands = np.concatenate([bands, bands])
    return np.stack([bands * np.sin(turns), bands * np.cos(turns)])


@keras.saving.register_keras_serializable(package="keras_vit")
class MixedFrequencies(keras.initializers.Initializer):
    """`initial_frequencies` as a Keras initializer; seed None draws one from numpy's global state (which
    `keras.utils.set_random_seed` seeds), so each block of a scanned encoder starts with its own directions."""

    def __init__(self, num_heads, head_dim, theta, seed=None):
        self.num_heads, self.head_dim, self.theta, self.seed = int(num_heads), int(head_dim), float(theta), seed

    def __call__(self, shape, dtype=None):
        seed = np.random.randint(2**31) if self.seed is None else self.seed
        return ops.cast(initial_frequencies(self.num_heads, self.head_dim, self.theta, seed), dtype or "float32")

    def get_config(self):
        return {"num_heads": self.num_heads, "head_dim": self.head_dim, "theta": self.theta, "seed": self.seed}


def angles(coordinates_, frequency_matrix):
    """Angles of each token's channel pairs: `(tokens, 1, pairs)`, or `(tokens, heads, pairs)` for per-head
    frequencies `(2, heads, pairs)`."""
    if len(frequency_matrix.shape) == 2:
        return ops.matmul(coordinates_, frequency_matrix)[:, None, :]
    return ops.einsum("tc,chp->thp", coordinates_, frequency_matrix)


def pairs_adjacent(name):
    """Whether kind `name` pairs adjacent channels (2i, 2i + 1), rather than the halves' (i, i + head_dim / 2)."""
    return name != "rope_dinov3"


def halves_first(name, weight):
    """A projection's `weight` (`(..., head_dim)`, static shape) with each pair's channels moved into two halves, so
    its output is in `rotate`'s order; as it is for a kind that pairs the halves."""
    if not pairs_adjacent(name):
        return weight
    *leading, head_dim = weight.shape
    pairs = ops.reshape(weight, (*leading, head_dim // 2, 2))
    return ops.reshape(ops.swapaxes(pairs, -1, -2), (*leading, head_dim))


def rotate(name, x, cos, sin, in_halves=False):
    """`x` (`(batch, tokens, heads, head_dim)`) with each pair turned; the pairs' channels come back in halves.
    `in_halves`: `x` is already in halves (`halves_first` projections), else adjacent pairs are sliced apart."""
    half = x.shape[-1] // 2
    if in_halves or not pairs_adjacent(name):
        first, second = x[..., :half], x[..., half:]
    else:
        first, second = x[..., 0::2], x[..., 1::2]
    return ops.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)
