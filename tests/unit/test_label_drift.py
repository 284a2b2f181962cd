"""continual/label_drift.py: an annotator who changes convention or quality is flagged against its own
history; steady annotators are not; a flagged round stays out of the history until accepted."""

import numpy as np
import pytest

from ecotrain.base.errors import DataError
from ecotrain.continual.label_drift import LabelDrift, _upper


def _round(rng, truth, n=300, errors=(0.03, 0.03, 0.03), swap=None, worse=None):
    """Three annotators label n examples each; the witness model is right 92% of the time."""
    preds, labels, who = [], [], []
    for a, err in enumerate(errors):
        y = rng.integers(0, 10, n)
        pred = np.where(rng.random(n) < 0.92, y, rng.integers(0, 10, n))
        lab = y.copy()
        e = rng.random(n) < (worse if worse and a == 1 else err)
        lab[e] = (lab[e] + rng.integers(1, 10, int(e.sum()))) % 10
        if swap and a == 2:
            lab[y == swap[0]] = swap[1]
        preds.append(pred)
        labels.append(lab)
        who += [f"ann{a}"] * n
    return np.concatenate(preds), np.concatenate(labels), np.array(who)


def test_steady_annotators_raise_no_alarm_and_a_drift_is_named():
    rng = np.random.default_rng(0)
    det = LabelDrift(alpha=0.01)
    for _ in range(4):
        assert det.observe(*_round(rng, None)) == []
    alarms = det.observe(*_round(rng, None, swap=(3, 5)))
    # what was 3 is now labelled 5: labels 5 the model reads as 3 (and more disagreement overall)
    assert {(a.annotator, a.kind, a.pair) for a in alarms} == {("ann2", "convention", (5, 3)), ("ann2", "quality", ())}
    conv = next(a for a in alarms if a.kind == "convention")
    assert "labels 5 the model reads as 3" in conv.line() and conv.now > 0.3 > conv.before
    # not folded into the history: the same labels next round are flagged again, until accepted
    assert {a.annotator for a in det.observe(*_round(rng, None, swap=(3, 5)))} == {"ann2"}
    det.accept("ann2")
    later = det.observe(*_round(rng, None, worse=0.25))
    assert any(a.annotator == "ann1" and a.kind == "quality" for a in later)


def test_the_first_round_and_small_counts_test_nothing():
    rng = np.random.default_rng(1)
    det = LabelDrift(min_labels=1000)
    det.observe(*_round(rng, None))
    assert det.observe(*_round(rng, None, swap=(1, 2))) == []  # history below min_labels: no test


def test_fishers_tail_is_exact_on_small_counts():
    assert _upper(3, 20, 0, 20) == pytest.approx(0.1153846, rel=1e-6)  # 3 of 40 all landing in one half
    assert _upper(0, 10, 5, 10) == pytest.approx(1.0)
    assert _upper(5, 5, 0, 5) == pytest.approx(1 / 252, rel=1e-6)  # C(10,5)


@pytest.mark.parametrize("bad", [dict(alpha=0), dict(alpha=1.5), dict(min_labels=0)])
def test_bad_settings_are_refused(bad):
    with pytest.raises(DataError):
        LabelDrift(**bad)


def test_mismatched_lengths_are_one_line():
    with pytest.raises(DataError, match="one value per example"):
        LabelDrift().observe(np.zeros(3), np.zeros(4), np.array(["a"] * 3))
