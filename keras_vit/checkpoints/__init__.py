"""Checkpoints of every format: read a file's configuration, load it into a model, write the formats.

Entry points: `read_checkpoint(path)` gives a file's `ViTConfig` and its
arrays, `config_from_checkpoint(path)` the configuration alone
(`keras_vit.ViT.from_checkpoint(path)`, in `keras_vit.model`, builds the
model a file describes: this package imports no model), `load_checkpoint(model, path)` loads a file
into a model that exists, `load_npz` / `save_npz` read and write the
official `.npz`, and `resolve_weights(weights)` decides what a `weights=`
value names (a file, a URL, a directory, a Keras weights file or a
pretrained name).

The modules:

- `official`: the official google-research/vision_transformer `.npz`, its
  `RULES` (keras_vit weight path <-> official key) and `official_config`;
- `big_vision`: big_vision's `.npz` (top-level `pos_embedding`, its block
  names, scanned blocks, `MAPHead_0`), converted to official keys;
- `hf_transformers`: Hugging Face `transformers` directories (`save_pretrained`):
  ViT, DeiT, DINOv2 and the CLIP and SigLIP image towers, read and written
  (`save_transformers`);
- `timm`: timm / Hugging Face `.safetensors` files and model directories,
  read and written (`save_timm`);
- `safetensors`: the safetensors file format, read with numpy alone;
- `loading`: puts arrays under official keys into a model (resizing,
  heads, checks): the one loader of every format;
- `pretrained`: the named released weights and their download
  (`WeightsUnavailable`: offline and not cached, in three lines);
- `resolve`: `resolve_weights`; `files`: local and `gs://` bytes.

Every format converts its files to the official keys, so `loading` serves
them all. Adding a format is one module and one line: write
`keras_vit/checkpoints/<format>.py` with

- `DESCRIPTION`: what it reads, for error messages (`"a big_vision '.npz'"`);
- `matches(path)`: whether `path` (a local path, or a URL before it is
  fetched) is one of its files, by its name or a marker file in a
  directory; cheap, and never claiming another format's files;
- `read(path, image_size=None, num_heads=None)`: `(ViTConfig, arrays)`,
  the configuration the file describes and its arrays under official keys
  (`official.RULES`), refusing by name what keras_vit cannot represent;
- `read_arrays(path, config=None)`: `(stated, arrays)`, the configuration
  the file states (None when it states none) and its arrays, `config` being
  the model's, for files whose shapes leave something open;
- optionally `labels(path)`: the class names the file states, or None
  (`checkpoint_labels`, which the exporter takes by default);

then add the module to `resolve.FORMATS` (before a format whose `matches`
it narrows): `resolve_weights` then takes its files for `weights=`, and
`read_checkpoint`, `load_checkpoint` and `ViT.from_checkpoint` read them. Tests:
a fixture the format's own code wrote, and the logits it gives.
"""

import os
import re

from keras_vit.checkpoints import big_vision, hf_transformers, official, pretrained, resolve, timm
from keras_vit.checkpoints.loading import load_arrays
from keras_vit.checkpoints.official import CONFIG_KEY, describe, official_key, read_npz, save_npz
from keras_vit.checkpoints.pretrained import WeightsUnavailable
from keras_vit.checkpoints.resolve import FORMATS, Weights, checkpoint_format, resolve_weights, weights_kind


def read_checkpoint(path, image_size=None, num_heads=None):
    """`(ViTConfig, arrays)`: any supported checkpoint, its arrays under official keys.

    `.npz`: an official file (local, `gs://`, or `https://`) or one keras_vit
    wrote; `.safetensors` or a directory: timm / Hugging Face
    (`keras_vit.checkpoints.timm`). `image_size` gives the grid of a non-square
    official table; `num_heads` that of a timm file without `config.json`.
    """
    module, location = checkpoint_format(path)
    return module.read(location, image_size=image_size, num_heads=num_heads)


def config_from_checkpoint(path, **overrides):
    """The `ViTConfig` a checkpoint holds, read from the file alone.

    Official `.npz` files: every released kind (class token or GAP,
    `pre_logits`, 1-D/2-D/relative position tables, hybrids, headless); files
    keras_vit wrote carry their whole configuration. timm / Hugging Face
    `.safetensors`: `config.json` when present, else the weight shapes.

    Raises:
        ValueError: naming the file, what was expected and what was found.
    """
    config, _ = read_checkpoint(path, overrides.get("image_size"), overrides.get("num_heads"))
    return config.replace(**overrides)


def load_checkpoint(model, path, source_grid_size=None):
    """Loads any supported checkpoint (see `read_checkpoint`) into `model` (`loading.load_arrays`)."""
    module, location = checkpoint_format(path)
    stated, arrays = module.read_arrays(location, getattr(model, "vit_config", None))
    return load_arrays(model, arrays, location, source_grid_size, stated=stated)


def load_npz(model, path, source_grid_size=None):
    """Loads an official `.npz` checkpoint into a keras_vit model (`loading.load_arrays`); a big_vision `.npz` is
    refused with a pointer to `load_checkpoint`, which reads its keys and numerics."""
    if big_vision.matches(path):
        raise ValueError(f"{path} is a big_vision checkpoint (its keys: pos_embedding, MultiHeadDotProductAttention_0"
                         ", ...), not the official format load_npz reads; use keras_vit.checkpoints.load_checkpoint("
                         "model, path), or ViT.from_checkpoint(path), which read big_vision's keys and numerics")
    return load_arrays(model, read_npz(path), str(path), source_grid_size)


def load_weights(model, weights):
    """Loads `weights` into `model`: a checkpoint (file, URL, directory) or a Keras `*.weights.h5` file."""
    resolved = resolve_weights(weights)  # a name is refused: only a named builder knows its variant
    if resolved.kind == "keras_weights":
        if resolve.missing(resolved.location, resolved.kind):  # before Keras' own h5py message
            raise resolve.no_such_path(resolved.location)
        model.load_weights(resolved.location)
        return model
    return load_checkpoint(model, resolved.location)


def save_transformers(model, directory, labels=None):
    """Writes `model` as a Hugging Face `transformers` directory (`config.json`, `model.safetensors`,
    `preprocessor_config.json`) that `from_pretrained` loads with the same outputs.

    `labels`: optional class names (`id2label`). See `hf_transformers.write`
    for the model classes written and what is refused.
    """
    return hf_transformers.write(model, directory, labels)


def save_timm(model, directory):
    """Writes `model` in timm's Hugging Face layout (`model.safetensors`, `config.json` with every argument in
    `model_args`), which `timm.create_model(architecture, **model_args)` loads with the same outputs
    (`timm.write`)."""
    return timm.write(model, directory)


def checkpoint_labels(path):
    """The class names a checkpoint states (a transformers directory's `id2label`), or None.

    A format states them through an optional `labels(path)`; transformers' placeholder names
    (`LABEL_0`, ...) state nothing.
    """
    module, location = checkpoint_format(path)
    labels = getattr(module, "labels", lambda _: None)(location)
    if labels is None or all(re.fullmatch(r"LABEL_\d+", name) for name in labels):
        return None
    return labels
