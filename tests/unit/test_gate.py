"""The evaluation gate: its decisions, and the continual metrics (average accuracy, forgetting,
backward transfer, per-cohort accuracy) on a real model with known outputs."""

import math

import pytest
import torch
from torch import nn

from ecotrain.continual.gate import GatePolicy, accuracy, decide, lineage_metrics, slice_metrics
from ecotrain.continual.registry import Slice


def test_promotes_when_recent_improves_and_holdout_holds():
    base = {"t0": 0.90, "t1": 0.80, "t2": 0.10}
    cand = {"t0": 0.89, "t1": 0.79, "t2": 0.70}
    ok, reason = decide(base, cand, ["t0", "t1"], "t2", GatePolicy(tolerance=0.02))
    assert ok and reason.startswith("promoted") and "drop +0.0100" in reason


def test_rejects_forgetting_beyond_tolerance():
    ok, reason = decide({"t0": 0.90, "t2": 0.10}, {"t0": 0.60, "t2": 0.95}, ["t0"], "t2", GatePolicy(tolerance=0.05))
    assert not ok and "forgets the holdout" in reason and "drop +0.3000" in reason


def test_rejects_no_gain_on_recent():
    ok, reason = decide({"t0": 0.9, "t1": 0.8}, {"t0": 0.95, "t1": 0.81}, ["t0"], "t1", GatePolicy(min_gain=0.05))
    assert not ok and "did not improve" in reason


def test_tolerance_is_inclusive_and_no_holdout_is_fine():
    ok, _ = decide({"a": 0.5, "b": 0.0}, {"a": 0.45, "b": 0.5}, ["a"], "b", GatePolicy(tolerance=0.05))
    assert ok
    ok, reason = decide({"b": 0.2}, {"b": 0.5}, [], "b", GatePolicy())
    assert ok and "no holdout yet" in reason


def test_forgetting_and_backward_transfer():
    now = {"t0": 0.70, "t1": 0.85, "t2": 0.90}
    history = [{"t0": 0.95}, {"t0": 0.80, "t1": 0.90}]  # earlier versions' accuracies
    learnt_at = {"t0": 0.95, "t1": 0.90}
    m = lineage_metrics(now, history, learnt_at)
    assert m["forgetting"] == {"t0": pytest.approx(0.25), "t1": pytest.approx(0.05)}
    assert m["average_forgetting"] == pytest.approx(0.15)
    assert m["backward_transfer"] == pytest.approx(((0.70 - 0.95) + (0.85 - 0.90)) / 2)


def test_slice_metrics_on_a_real_model():
    model = nn.Linear(2, 3, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]]))  # argmax: 0 if x0>x1, else 1
    x = torch.tensor([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0], [0.0, 2.0]])
    a = Slice("a", x, torch.tensor([0, 1, 1, 1]), torch.tensor([0, 0, 1, 1]))  # 3 of 4 right; cohort 1: 1 of 2
    b = Slice("b", x[:2], torch.tensor([2, 2]), torch.tensor([1, 1]))  # none right
    m = slice_metrics(model, [a, b])
    assert m["tasks"] == {"a": 0.75, "b": 0.0}
    assert m["average_accuracy"] == pytest.approx(0.375)  # the mean over tasks, not over examples
    assert m["cohorts"] == {"0": 1.0, "1": pytest.approx(0.25)}


@pytest.mark.parametrize("tolerance", [0.02, 0.05])
def test_tolerance_is_the_exact_boundary(tolerance):
    """A drop just past the tolerance is refused, one just inside (or at it) promoted: a gate that
    lets through twice the tolerance, or half, fails here."""
    base = {"old": 0.80, "new": 0.10}
    for drop, promoted in ((tolerance * 1.01, False), (tolerance * 1.5, False), (tolerance, True), (tolerance * 0.99, True)):
        ok, reason = decide(base, {"old": 0.80 - drop, "new": 0.90}, ["old"], "new", GatePolicy(tolerance=tolerance))
        assert ok is promoted, (drop, reason)
        assert reason.startswith("promoted" if promoted else "rejected: forgets the holdout")


def test_default_policy_tolerates_two_points():
    assert GatePolicy().tolerance == 0.02 and GatePolicy().min_gain == 0.0  # the documented defaults (CLI --tolerance)
    base = {"old": 0.80, "new": 0.10}
    assert decide(base, {"old": 0.78, "new": 0.90}, ["old"], "new", GatePolicy())[0]
    assert not decide(base, {"old": 0.7799, "new": 0.90}, ["old"], "new", GatePolicy())[0]


def test_min_gain_is_the_exact_boundary():
    base = {"old": 0.75, "new": 0.5}  # binary fractions: the gain is exactly 0.25, no rounding noise
    policy = GatePolicy(tolerance=0.0, min_gain=0.25)
    assert not decide(base, {"old": 0.75, "new": 0.75}, ["old"], "new", policy)[0]  # exactly min_gain: not more
    assert decide(base, {"old": 0.75, "new": 0.7501}, ["old"], "new", policy)[0]
    assert not decide(base, {"old": 0.80, "new": 0.50}, ["old"], "new", GatePolicy())[0]  # no gain at all


def test_reasons_name_both_slices_and_figures_are_rounded_to_six_places():
    ok, reason = decide({"old": 0.75, "new": 0.25}, {"old": 0.75, "new": 0.5}, ["old"], "new", GatePolicy())
    assert ok and reason == ("promoted: recent 'new' 0.2500 -> 0.5000 (gain +0.2500, min 0.0); "
                             "holdout 0.7500 -> 0.7500 (drop +0.0000, tolerance 0.02)")
    assert decide({"new": 0.25}, {"new": 0.5}, [], "new", GatePolicy())[1].endswith("; no holdout yet")
    m = lineage_metrics({"a": 0.0}, [{"a": 1 / 3}], {"a": 1 / 3})
    assert m["forgetting"] == {"a": 0.333333} and m["average_forgetting"] == 0.333333
    assert m["backward_transfer"] == -0.333333
    model = nn.Linear(1, 2, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0], [-1.0]]))  # class 0 for x > 0
    s = Slice("s", torch.tensor([[1.0], [1.0], [1.0]]), torch.tensor([0, 1, 1]), torch.tensor([0, 0, 0]))
    got = slice_metrics(model, [s])
    assert got["tasks"] == {"s": 0.333333} and got["cohorts"] == {"0": 0.333333}


def test_accuracy_of_an_empty_slice_is_nan():
    assert math.isnan(accuracy(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long)))
