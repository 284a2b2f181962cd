"""Drift figures against hand-computed values; alerts only past their thresholds."""

import pytest
import torch

from ecotrain.continual.drift import DriftThresholds, drift_report, ece


def _probs(rows):
    return torch.tensor(rows, dtype=torch.float32)


def test_ece_matches_hand_computation():
    # every prediction says 0.8, half are right: |0.8 - 0.5| = 0.3 in the one bin used
    probs = _probs([[0.8, 0.2]] * 4)
    y = torch.tensor([0, 0, 1, 1])
    assert ece(probs, y) == pytest.approx(0.3, abs=1e-6)
    # two bins: 0.9 all right (gap 0.1), 0.6 all wrong (gap 0.6), equal weight: 0.35
    probs = _probs([[0.9, 0.1], [0.9, 0.1], [0.4, 0.6], [0.4, 0.6]])
    assert ece(probs, torch.tensor([0, 0, 0, 0])) == pytest.approx(0.35, abs=1e-6)


def test_label_and_confidence_shift():
    ref = _probs([[0.9, 0.1, 0.0]] * 2 + [[0.1, 0.9, 0.0]] * 2)  # predicted 0,0,1,1; confidence 0.9
    new = _probs([[0.0, 0.4, 0.6]] * 4)  # predicted 2 everywhere; confidence 0.6
    r = drift_report(ref, torch.tensor([0, 0, 1, 1]), new, None, None)
    assert r["label_shift"] == pytest.approx(1.0)  # disjoint predicted-label distributions
    assert r["confidence_shift"] == pytest.approx(-0.3)
    assert r["reference_ece"] == pytest.approx(0.1, abs=1e-6)
    assert any("predicted-label distribution shifted by 1.000" in a for a in r["alerts"])
    assert any("mean confidence 0.900 -> 0.600" in a for a in r["alerts"])
    assert "ece" not in r  # no labels for the incoming data


def test_no_alert_below_thresholds_and_cohort_error():
    ref = _probs([[0.9, 0.1], [0.1, 0.9]] * 5)
    new = _probs([[0.85, 0.15], [0.15, 0.85]] * 5)
    y = torch.tensor([0, 1] * 5)
    cohort = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1, 1, 1])
    r = drift_report(ref, y, new, y, cohort)
    assert r["alerts"] == [] and r["label_shift"] == 0.0
    assert r["cohort_error"] == {"0": 0.0, "1": 0.0}
    y_bad = y.clone()
    y_bad[5:] = 1 - y_bad[5:]  # cohort 1 all wrong
    r = drift_report(ref, y, new, y_bad, cohort, DriftThresholds(ece=1.0))
    assert r["cohort_error"] == {"0": 0.0, "1": 1.0}
    assert r["alerts"] == ["drift alert: 1 cohort(s) with error above 0.5, worst cohort 1 at 1.000"]
