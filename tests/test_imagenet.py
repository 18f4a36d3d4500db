import numpy as np
import pytest

from keras_vit import decode_predictions
from keras_vit.imagenet import class_index


def test_class_index_is_the_standard_one():
    index = class_index()
    assert len(index) == 1000
    assert index[0] == ("n01440764", "tench") and index[999] == ("n15075141", "toilet_tissue")
    wnids = [wnid for wnid, _ in index]
    assert wnids == sorted(set(wnids))


def test_decodes_best_first():
    scores = np.zeros((2, 1000), "float32")
    scores[0, [1, 207, 999]] = [0.2, 0.7, 0.1]
    scores[1, 0] = 3.0
    decoded = decode_predictions(scores, top=3)
    assert [name for _, name, _ in decoded[0]] == ["golden_retriever", "goldfish", "toilet_tissue"]
    assert decoded[0][0][2] == pytest.approx(0.7) and decoded[1][0][:2] == ("n01440764", "tench")


def test_wrong_shape():
    with pytest.raises(ValueError, match=r"\(batch, 1000\); received an array of shape \(2, 10\)"):
        decode_predictions(np.zeros((2, 10)))


@pytest.mark.parametrize("top", [0, -1, 1001, 2.5, True])
def test_a_top_outside_1_to_1000_is_refused(top):
    # top=-1 returned 999 classes, top=0 none.
    with pytest.raises(ValueError, match=rf"`top` must be an integer from 1 to 1000; received top={top!r}"):
        decode_predictions(np.zeros((1, 1000)), top=top)


def test_nan_scores_are_refused_not_ranked_first():
    scores = np.zeros((2, 1000))
    scores[1, [3, 5]] = np.nan
    with pytest.raises(ValueError, match=r"NaN scores in rows \[1\]"):
        decode_predictions(scores)
    log_probabilities = np.where(np.eye(1000)[[7]] > 0, 0.0, -np.inf)
    assert decode_predictions(log_probabilities, top=1)[0][0][1] == "cock"  # -inf is a score
