"""What a `weights=` value names, and which format reads a checkpoint, decided in one place.

The builders, `ViT(weights=...)`, the trainer's `--pretrained` and its
recipe checks all ask `resolve_weights`, and the readers `checkpoint_format`;
no other module looks at a suffix or a scheme to tell a name from a file.
The kinds:

- `"file"`: a checkpoint file, `.npz` or `.safetensors`, local or on a file
  system with a scheme (`gs://`);
- `"url"`: an `http(s)://` checkpoint, fetched once into the Keras cache;
- `"directory"`: a Hugging Face model directory;
- `"keras_weights"`: a Keras `*.weights.h5` file;
- `"hub"`: a Hugging Face hub id (`org/name`) that names no local path, read
  from `huggingface_hub`'s cache or downloaded into it (`keras_vit.checkpoints.hub`);
- `"pretrained"`: the name of released weights of a variant
  (`"augreg_in21k_ft_in1k"`), looked up in `keras_vit.checkpoints.pretrained`.

A value that can only be a path (`looks_like_path`) and does not exist is
refused as "no such file or directory" before it is taken for a name; a plain
`org/name` may be a folder or a hub id, so the hub's errors for it say that no
local path of that name exists either.
"""

import dataclasses
import logging
import os
import re

from keras_vit.checkpoints import big_vision, files, hf_transformers, hub, official, pretrained, timm

# The checkpoint formats, one module each (the recipe: keras_vit/checkpoints/__init__.py); a path is read by the
# first whose `matches` takes it.
FORMATS = (big_vision, official, hf_transformers, timm)
KERAS_WEIGHTS_SUFFIX = ".weights.h5"
KINDS = ("file", "url", "directory", "keras_weights", "hub", "pretrained")
# Suffixes of files a `weights=` value names: a value ending in one is a path, never a name or a hub id.
PATH_SUFFIXES = (".npz", ".safetensors", ".h5", ".keras")


@dataclasses.dataclass(frozen=True)
class Weights:
    """A resolved `weights=` value."""

    # One of KINDS.
    kind: str
    # What to open: the path, directory or URL (for named weights, their file's URL).
    location: str
    # The table entry of named weights (image size, classes, ...); None for the other kinds.
    entry: pretrained.PretrainedWeights | None = None

    @property
    def local(self):
        """Whether `location` is on this machine (no scheme such as `gs://` or `https://`)."""
        return not files.has_scheme(self.location)


def _text(weights):
    if isinstance(weights, os.PathLike):
        weights = os.fspath(weights)
    if not isinstance(weights, str) or not weights:
        raise ValueError("`weights` must be a path, a URL or the name of pretrained weights (a non-empty str "
                         f"or path); received weights={weights!r}")
    return weights


def looks_like_path(text):
    """Whether `text` can only be a path: it starts with `.`, `/` or `~`, has more folders than a hub id's
    `org/name`, or a checkpoint's suffix. A plain `org/name` may be a folder or a hub id; a bare word a name."""
    text = str(text)
    return (text.startswith((".", "/", "~", os.sep)) or text.count("/") > 1 or (os.sep != "/" and os.sep in text)
            or text.endswith(PATH_SUFFIXES))


def missing(text, kind):
    """Whether `text`, of `kind`, is a local path that does not exist (a name or a hub id is no path)."""
    path_like = kind in ("file", "directory", "keras_weights") or (kind == "pretrained" and looks_like_path(text))
    return path_like and not files.has_scheme(text) and not os.path.lexists(text)


def no_such_path(text):
    """The error for a missing local path, saying where a relative one was looked for."""
    where = "" if os.path.isabs(text) else f" (relative to {os.getcwd()})"
    if text.startswith("~"):
        where = " (`~` is not expanded here: write the full path)"
    return ValueError(f"no such file or directory: {text!r}{where}")


def weights_kind(weights):
    """The kind (`KINDS`) of a `weights=` value, read off its form: no file is read, nothing is looked up.

    A value no format of `FORMATS` takes is a hub id (`org/name`, no such local path) or a pretrained name.
    """
    text = _text(weights)
    if text.endswith(KERAS_WEIGHTS_SUFFIX):
        return "keras_weights"
    if text in {entry.tag for entry in pretrained.table().values()}:
        return "pretrained"  # a folder of that name is not asked for: `./imagenet21k` names it
    if not any(module.matches(text) for module in FORMATS):
        return "hub" if hub.is_hub_id(text) else "pretrained"
    if re.match(r"https?://", text):
        return "url"
    return "directory" if os.path.isdir(text) else "file"


def resolve_weights(weights, variant=None):
    """What `weights` names: a checkpoint file, URL or directory, a Keras weights file, or named weights.

    Args:
        weights: str or path. A `.npz` / `.safetensors` path or URL, a
            Hugging Face model directory, a `*.weights.h5` file, or the name
            of pretrained weights of `variant`.
        variant: the variant named weights belong to (`"B/16"`); None where
            no variant is known (`keras_vit.ViT`), which refuses names.

    Returns:
        A `Weights` (`kind`, `location`, and `entry`, the table entry of named weights).

    Raises:
        ValueError: for a name without a variant, or a name the variant has no weights under (listing those it
            has); for a value that can only be a path (`looks_like_path`) and does not exist.

    Example:
    >>> resolve_weights("ViT-B_16.npz").kind, resolve_weights("https://host/ViT-B_16.npz").kind
    ('file', 'url')
    >>> resolve_weights("augreg_in21k_ft_in1k", "B/16").location.endswith(".npz")
    True
    """
    kind, text = weights_kind(weights), _text(weights)
    if kind != "pretrained":
        return Weights(kind, text)
    if missing(text, kind):  # `./hf/deit` is a missing folder, not a name to look up
        raise no_such_path(text)
    if variant is None:
        raise ValueError(
            "`weights` must be None, the path or URL of a checkpoint (official '.npz', timm / Hugging Face "
            "'.safetensors' or model directory), a Keras '.weights.h5' file, or (in a named builder such as "
            f"ViT_B16) the name of pretrained weights; received weights={text!r}"
        )
    entry = pretrained.resolve(variant, text)
    return Weights("pretrained", entry.url, entry)


def checkpoint_format(path):
    """`(format module, local path)` of a checkpoint; an `https://` file is fetched once into the Keras cache.

    Raises:
        ValueError: for a local path that does not exist; for a pretrained name or a Keras weights file, naming
            the formats a checkpoint may be.
        WeightsUnavailable: for a URL or hub id neither cached nor downloadable.
    """
    kind = weights_kind(path)
    if kind != "keras_weights" and missing(_text(path), kind):  # said first: no format reads a missing path
        raise no_such_path(_text(path))
    accepted = ", ".join(module.DESCRIPTION for module in FORMATS)
    if kind in ("pretrained", "keras_weights"):
        raise ValueError(f"A checkpoint must be {accepted}; received {_text(path)!r}")
    location = {"url": pretrained.fetch, "hub": hub.snapshot}.get(kind, str)(_text(path))
    for module in FORMATS:
        if module.matches(location):
            logging.info("%s is read as %s", location, module.DESCRIPTION)
            return module, location
    raise ValueError(f"No checkpoint format reads {location!r}; expected {accepted}")
