"""What every kind of position embedding provides, and the defaults of a kind without tables.

A kind is a stateless object: the layers hold the weights and call the kind
with them. A kind owns
- its role: `adds_to_tokens` (a `(rows * cols, width)` table added to the
  patch tokens, in `PositionEmbedding`) or `biases_attention` (logits added
  in every block's `MultiHeadSelfAttention`);
- its weights: `weight_shapes` (names and shapes; the layer picks the
  initializer);
- its computation: `table` (and `prefix_table`) or `logits`;
- its resize to another grid: `resize`, in float64 numpy when a checkpoint
  is loaded at another size;
- its checkpoint keys: `checkpoint_keys`, and `in_file` / `file_grid`,
  which recognise its tables in a file and read their grid back.

Argument names shared by the methods:
    weights: dict of weight name -> variable, tensor or array.
    grid_size: (rows, cols), the patch grid the weights are made for.
    prefix_rows: int. Prefix tokens the tables give a position: rows before
        the grid in a `learned_1d` table (0 with timm's `no_embed_class`),
        tokens before the patches in relative attention.
    interpolation: `"bilinear"` (corner-aligned, official) or `"bicubic"`.
"""

import math
import re


def square_grid(num_patches, what):
    """`(side, side)` for a table of `num_patches` patch positions; a ValueError when it is not a square."""
    side = math.isqrt(num_patches)
    if side * side != num_patches:
        raise ValueError(
            f"{what} holds {num_patches} patch positions, not a square grid; give its grid: "
            "`image_size=(height, width)` to ViT.from_checkpoint, `source_grid_size=(rows, cols)` to a loader"
        )
    return side, side


def needs_resample(size, grid_size):
    """Whether a table made for `grid_size` must be resampled for `size`.

    Tensors stand for sizes unknown until run time: those are always
    resampled (the interpolation matrices are the identity when sizes agree).
    """
    static = all(isinstance(n, int) for n in size)
    return not static or tuple(size) != tuple(grid_size)


class PositionKind:
    """A kind of position embedding; this base is a kind with no tables and no role."""

    name = None
    adds_to_tokens = False
    biases_attention = False
    # Weight name -> its key in an official-format checkpoint (official, or a
    # keras_vit extension); "{block}" stands for the encoder block's index.
    checkpoint_keys = {}

    @property
    def weight_names(self):
        """The names of the kind's weights: every weight has a checkpoint key."""
        return tuple(self.checkpoint_keys)

    def weight_shapes(self, width, grid_size, prefix_rows, num_heads=None):
        """`{weight name: shape}` in creation order; a ValueError when `width` does not suit the kind."""
        return {}

    def table(self, weights, size, grid_size, prefix_rows, width, interpolation):
        """The `(rows * cols, width)` embeddings of the grid `size` (ints or scalar tensors); None for none."""
        return None

    def prefix_table(self, weights, prefix_rows):
        """`(1, prefix_rows, width)` added to the prefix tokens, or None when they get no position."""
        return None

    def logits(self, weights, query, grid_size, prefix_rows, interpolation):
        """The attention logits `(batch, heads, L, L)` of the scaled `query`, `(batch, L, heads, head_dim)`."""
        raise NotImplementedError(f"position embedding {self.name!r} does not bias attention")

    def resize(self, tables, grid_size, prefix_rows, interpolation, source_grid=None):
        """`tables` (float64 numpy, by weight name) resampled for `grid_size`, as float32 numpy.

        `source_grid` is the grid the tables are made for, where their shapes
        do not say it (a `learned_1d` table of a non-square grid).
        """
        return {}

    def checkpoint_rules(self):
        """`(weight path pattern, key template)` rows, in the format of `keras_vit.checkpoints.official.RULES`."""
        layer = r"encoder_block_(\d+)/attention" if self.biases_attention else "position_embedding"
        return tuple(
            (f"{layer}/{re.escape(name)}", key.replace("{block}", r"\1"))
            for name, key in self.checkpoint_keys.items()
        )

    def file_tables(self, arrays, block=0):
        """This kind's tables among a file's `arrays` (official keys), by weight name."""
        keys = {name: key.format(block=block) for name, key in self.checkpoint_keys.items()}
        return {name: arrays[key] for name, key in keys.items() if key in arrays}

    def in_file(self, tables):
        """Whether `tables` (`file_tables`) are this kind's: its first table is there."""
        return bool(self.checkpoint_keys) and next(iter(self.checkpoint_keys)) in tables

    def file_grid(self, tables, prefix_rows, source):
        """The `(rows, cols)` grid `tables` are made for; `source` names the file in errors."""
        raise ValueError(f"{source}: position embedding {self.name!r} has no tables to read a grid from")

    def __repr__(self):
        return f"<position embedding {self.name!r}>"
