"""Named pretrained weights: the official checkpoints, and fetching them.

The table is data (`keras_vit/data/pretrained_weights.json`, with the
source of every field): each entry names a file of google-research/
vision_transformer's public bucket `gs://vit_models`, its variant,
resolution, classes, representation size and published ImageNet top-1.
Names are `"<model>:<tag>"`, e.g. `"ViT-B/16:augreg_in21k_ft_in1k"`; a named
builder takes the tag alone (`keras_vit.ViT_B16(weights="imagenet21k")`).

Traps the table records: the 2020 `imagenet21k/` files carry a tanh
`pre_logits` layer and a deliberately zeroed 21843-class head (features and
fine-tuning only); the AugReg `augreg_in21k` files keep a real 21843-class
head and have no `pre_logits`.
"""

import dataclasses
import functools
import hashlib
import http.client
import json
import logging
import os
import pathlib
import shutil
import urllib.parse
import urllib.request

from keras_vit.atomic_files import atomic_file

TABLE = pathlib.Path(__file__).parent.parent / "data" / "pretrained_weights.json"
BUCKET = "https://storage.googleapis.com/vit_models/"


@dataclasses.dataclass(frozen=True)
class PretrainedWeights:
    """One released checkpoint."""

    # "<model>:<tag>", e.g. "ViT-B/16:imagenet21k".
    name: str
    # The keras_vit variant it fits, e.g. "B/16" or "R50+B/16".
    variant: str
    # Public https location (gs://vit_models/... over https).
    url: str
    # Square resolution it was trained or fine-tuned at.
    image_size: int
    # Classes of its head: 1000 (ImageNet-1k) or 21843 (ImageNet-21k).
    classes: int
    # Width of its tanh pre_logits layer, or None.
    representation_size: int | None
    # Published ImageNet-1k top-1 (%), or None; `top1_source` says whose.
    top1: float | None
    top1_source: str | None
    license: str
    note: str

    @property
    def tag(self):
        return self.name.split(":", 1)[1]

    @property
    def zeroed_head(self):
        """The 2020 `imagenet21k/` files: their 21843-class head was zeroed."""
        return self.tag == "imagenet21k"

    @property
    def gs_path(self):
        return "gs://vit_models/" + self.url[len(BUCKET):]


@functools.cache
def table():
    """All entries, keyed by name."""
    fields = {f.name for f in dataclasses.fields(PretrainedWeights)}
    entries = json.loads(TABLE.read_text())["entries"]
    return {e["name"]: PretrainedWeights(**{k: v for k, v in e.items() if k in fields}) for e in entries}


def model_name(variant):
    """The official model name of a variant: "B/16" -> "ViT-B/16", "R50+B/16" -> "R50+ViT-B/16"."""
    stem, _, body = variant.rpartition("+")
    return f"{stem}+ViT-{body}" if stem else f"ViT-{body}"


def resolve(variant, tag):
    """The entry for `tag` of `variant`; a ValueError lists the tags it has."""
    entry = table().get(f"{model_name(variant)}:{tag}")
    if entry is None:
        tags = sorted(e.tag for e in table().values() if e.variant == variant)
        raise ValueError(
            f"No pretrained weights named {tag!r} for {model_name(variant)}; "
            f"available: {tags or 'none'} (or pass the path of an .npz or .weights.h5 file)"
        )
    return entry


def cache_path(url):
    """Where `fetch` keeps `url`: `$KERAS_HOME/vit_models/<the bucket path>`.

    A file of another server goes under a folder named by its host and port
    (and a hash of its query string, when it has one), so that two servers'
    `model.npz` are never taken for each other.
    """
    parts = urllib.parse.urlparse(url)
    relative = urllib.parse.unquote(parts.path).lstrip("/")
    if url.startswith(BUCKET) and not parts.query:
        relative = relative.removeprefix("vit_models/")
    else:
        host = (parts.hostname or "local") + (f"_{parts.port}" if parts.port else "")
        query = f"/{hashlib.sha256(parts.query.encode()).hexdigest()[:16]}" if parts.query else ""
        relative = f"{host}{query}/{relative}"
    keras_home = os.environ.get("KERAS_HOME", os.path.join(os.path.expanduser("~"), ".keras"))
    return pathlib.Path(keras_home) / "vit_models" / relative


class WeightsUnavailable(OSError, ValueError):
    """Weights neither on this machine nor downloadable now (offline, a server down), said in three lines.

    What could not be fetched and from where; where to put a copy downloaded
    elsewhere so that keras_vit finds it next time; and how to pass a local
    copy instead, in Python, to the trainer and to the exporter. Raised `from
    None`: the network's own error is the reason in the first line, not a
    chained traceback. An OSError, as a failed download was, and a
    ValueError, as an uncached hub id was, so `except` clauses written for
    either still catch it.

    Args:
        what: what the user named, e.g. "ViT-B/16:imagenet21k"; None for a bare URL.
        url: where it was asked for.
        reason: why that failed, one line (the exception, or what it wraps).
        put: where a copy goes, completing "Download it where there is network access and ...".
        local: what to pass instead, completing "or pass ... instead".
    """

    __module__ = "keras_vit.checkpoints"  # where users catch it, and what a traceback names

    def __init__(self, what, url, reason, put, local="its local path"):
        self.what, self.url, self.reason, self.put, self.local = what, url, reason, put, local
        named = f"{what} from {url}" if what else url
        super().__init__(
            f"Could not download {named} ({reason}).\n"
            f"Download it where there is network access and {put}, where keras_vit looks first,\n"
            f"or pass {local} instead: weights=PATH in Python, --pretrained=PATH to the trainer, "
            f"--model=PATH to the exporter.")

    def __reduce__(self):  # pickled (by a worker process) with the fields its message is made of
        return type(self), (self.what, self.url, self.reason, self.put, self.local)


def one_line(error):
    """Why `error` happened, in one short line: the innermost error it wraps (urllib's `reason`, a chained cause)."""
    while True:
        reason = getattr(error, "reason", None)
        # Not `__context__`: http.client's IncompleteRead has a ValueError of its own parsing as context.
        inner = error.__cause__ or (reason if isinstance(reason, BaseException) else None)
        if inner is None:
            break
        error = inner
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def fetch(url, timeout=60):
    """Downloads `url` once into the Keras cache and returns the local path.

    The download goes to a temporary name and is renamed when complete (all
    the bytes the server announced), so an interrupted download is never
    taken for a checkpoint.

    Raises:
        WeightsUnavailable: when the file is not cached and cannot be
            downloaded: the URL, the cache path to put a copy at, and how to
            pass a local path instead.
    """
    target = cache_path(url)
    if target.exists():
        return str(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(target) as out, urllib.request.urlopen(url, timeout=timeout) as response:
            shutil.copyfileobj(response, out, length=1 << 20)
            announced = response.headers.get("Content-Length")
            # http.client ends a body cut short without an error: count the bytes.
            if announced is not None and out.tell() != int(announced):
                raise OSError(f"the connection closed after {out.tell()} of {announced} bytes")
    except (OSError, http.client.HTTPException) as error:  # URLError, timeouts, disk errors; a chunked body cut short
        names = {entry.url: entry.name for entry in table().values()}
        raise WeightsUnavailable(names.get(url), url, one_line(error), f"put it at {target}") from None
    logging.info("Downloaded %s to %s", url, target)
    return str(target)


def markdown_table():
    """The table as Markdown, for docs/PRETRAINED.md (a test keeps it current)."""
    lines = [
        "| name | file (gs://vit_models/...) | px | classes | pre_logits | ImageNet top-1 |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for e in table().values():
        top1 = "n/a"
        if e.top1 is not None:
            who = "Google" if e.top1_source.startswith("google") else "timm's evaluation"
            top1 = f"{e.top1:.2f} ({who})"
        lines.append(
            f"| `{e.name}` | `{e.gs_path[len('gs://vit_models/'):]}` | {e.image_size} | {e.classes} "
            f"| {e.representation_size or '-'} | {top1} |"
        )
    return "\n".join(lines) + "\n"
