"""The gate's float margin at each boundary, hit exactly: a gain of exactly min_gain (plus the 1e-12
margin) is no gain, a drop of exactly the tolerance or the cap (plus the margin) is tolerated; and a
cap with no holdout yet."""

import pytest
import torch

from ecotrain.continual.gate import GatePolicy, decide, slice_metrics

pytestmark = pytest.mark.unit

M = 1e-12  # gate.py's float margin


def test_a_gain_of_exactly_min_gain_plus_the_margin_is_no_gain():
    edge = 0.25 + M
    ok, reason = decide({"r": 0.0}, {"r": edge}, [], "r", GatePolicy(min_gain=0.25))
    assert not ok and reason.startswith("rejected: the recent slice did not improve")
    assert decide({"r": 0.0}, {"r": 0.25 + 2 * M}, [], "r", GatePolicy(min_gain=0.25))[0]


def test_a_drop_of_exactly_the_tolerance_plus_the_margin_is_tolerated():
    tol = 0.25 - M  # tol + M == 0.25 exactly, a drop the six-place rounding of the means keeps
    assert tol + M == 0.25
    base, cand = {"old": 0.5, "r": 0.0}, {"old": 0.25, "r": 1.0}
    assert decide(base, cand, ["old"], "r", GatePolicy(tolerance=tol))[0]
    assert not decide(base, {**cand, "old": 0.249999}, ["old"], "r", GatePolicy(tolerance=tol))[0]


def test_a_single_drop_of_exactly_the_cap_plus_the_margin_is_tolerated():
    base, cand = {"a": 0.25 + M, "b": 0.0, "r": 0.0}, {"a": 0.0, "b": 0.25 + M, "r": 1.0}
    ok, reason = decide(base, cand, ["a", "b"], "r", GatePolicy(tolerance=0.5, cap=0.25))
    assert ok, reason
    worse = {**cand, "a": -2 * M}
    assert not decide(base, worse, ["a", "b"], "r", GatePolicy(tolerance=0.5, cap=0.25))[0]


def test_a_cap_with_no_holdout_yet_promotes_on_the_recent_slice():
    ok, reason = decide({"r": 0.1}, {"r": 0.9}, [], "r", GatePolicy(cap=0.01))
    assert ok and "no holdout yet" in reason


def test_no_slices_yet_have_no_average():
    out = slice_metrics(torch.nn.Linear(2, 2), [])
    assert out["tasks"] == {} and out["average_accuracy"] is None
