"""Checkpoints of every format: read a file's configuration, build its model, load it, write official files.

Entry points: `read_checkpoint(path)` gives a file's `ViTConfig` and its
arrays, `config_from_checkpoint(path)` the configuration alone,
`from_checkpoint(path)` (also `keras_vit.ViT.from_checkpoint`) the model the
file describes with its weights, `load_checkpoint(model, path)` loads a file
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
  ViT / DeiT read and written (`save_transformers`), DINOv2, CLIP and SigLIP
  image towers read;
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
`read_checkpoint`, `load_checkpoint` and `from_checkpoint` read them. Tests:
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


def checkpoint_stem(path):
    """A model name from a checkpoint's file name: "ViT-B_16.npz" -> "ViT-B_16"."""
    stem = os.path.basename(str(path).rstrip("/"))
    return re.sub(r"\W", "_", stem.rsplit(".", 1)[0] if "." in stem else stem)


def from_checkpoint(path, *, include_top=None, classifier_activation="softmax", name=None, **overrides):
    """Builds the model a checkpoint describes and loads it: `keras_vit.ViT.from_checkpoint(path)`.

    Args:
        path: an official or big_vision `.npz` (official: also `gs://`,
            `https://`), a timm `.safetensors` file or model directory, a
            Hugging Face `transformers` directory, or a hub id (`org/name`,
            through `huggingface_hub`'s cache).
        include_top: bool. Defaults to True when the file has a head.
        classifier_activation: the head's activation. Defaults to "softmax".
        name: the model's name. Defaults to the file's stem.
        **overrides: `ViTConfig` fields that differ from the file's, e.g.
            `image_size=384` (position tables resized), `patch_size=8`
            (FlexiViT: the patch kernel resampled by `keras_vit.patch_resize`,
            bicubic for files with timm's numerics, else bilinear; the
            position tables resized to the new grid), `classes=10` (a new
            head at zero), `representation_size=None` (pre_logits dropped),
            `drop_path_rate=0.1`.

    Returns:
        A `ViTModel` with the checkpoint's weights.
    """
    # Imported here: the model module imports this package (`ViT(weights=...)`, `ViT.from_checkpoint`).
    from keras_vit.model import ViT

    # One read: the file's configuration and its arrays (a B/16 file is 330 MB).
    config, arrays = read_checkpoint(path, overrides.get("image_size"), overrides.get("num_heads"))
    if "patch_size" in overrides:
        arrays = _with_patch_size(config, arrays, overrides["patch_size"])
    model = ViT(config.replace(**overrides), include_top=include_top, classifier_activation=classifier_activation,
                name=name or checkpoint_stem(path))
    return load_arrays(model, arrays, str(path), overridden=tuple(overrides))


def _with_patch_size(config, arrays, patch_size):
    """`arrays` with the patch kernel resampled to `patch_size` (FlexiViT's pseudo-inverse resize)."""
    from keras_vit.checks import to_pair
    from keras_vit.patch_resize import resample_patch_kernel

    patch_size = to_pair(patch_size, "patch_size")
    if patch_size == config.patch_size:
        return arrays
    # The resize the kernel undoes: timm's (bicubic) for files in timm's numerics, else FlexiViT's (bilinear).
    method = "bicubic" if config.interpolation.startswith("bicubic") else "bilinear"
    return {**arrays, "embedding/kernel": resample_patch_kernel(arrays["embedding/kernel"], patch_size, method)}


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
