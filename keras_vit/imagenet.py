"""ImageNet-1k labels: `decode_predictions`, as `keras.applications` has it.

The class index ships with the package (`data/imagenet_class_index.json`,
the file `keras.applications` downloads), so decoding needs no network.
"""

import functools
import json
import pathlib

import numpy as np

CLASS_INDEX = pathlib.Path(__file__).parent / "data" / "imagenet_class_index.json"


@functools.cache
def class_index():
    """`[(wordnet_id, name), ...]` for the 1000 classes, in logit order."""
    index = json.loads(CLASS_INDEX.read_text())
    return [tuple(index[str(i)]) for i in range(len(index))]


def decode_predictions(preds, top=5):
    """Decodes ImageNet-1k scores into `(wordnet_id, name, score)` tuples.

    Args:
        preds: array-like `(batch, 1000)` of probabilities or logits.
        top: int. How many classes to return per image. Defaults to 5.

    Returns:
        A list (one per image) of the `top` tuples, best first.

    Example:
    >>> decode_predictions(np.eye(1000)[[1]], top=1)
    [[('n01443537', 'goldfish', 1.0)]]
    """
    preds = np.asarray(preds)
    labels = class_index()
    if preds.ndim != 2 or preds.shape[1] != len(labels):
        raise ValueError(
            f"`decode_predictions` expects a batch of ImageNet-1k scores of shape (batch, {len(labels)}); "
            f"received an array of shape {preds.shape}"
        )
    if isinstance(top, bool) or not isinstance(top, (int, np.integer)) or not 1 <= top <= len(labels):
        raise ValueError(f"`top` must be an integer from 1 to {len(labels)}; received top={top!r}")
    if np.isnan(preds).any():  # argsort would rank NaN first: a class no score chose
        raise ValueError(f"`decode_predictions` received NaN scores in rows "
                         f"{sorted(set(np.nonzero(np.isnan(preds))[0].tolist()))[:10]}")
    result = []
    for row in preds:
        best = np.argsort(row)[::-1][:top]
        result.append([(*labels[i], float(row[i])) for i in best])
    return result
