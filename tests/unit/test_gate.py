"""The evaluation gate: its decisions, and the continual metrics (average accuracy, forgetting,
backward transfer, per-cohort accuracy) on a real model with known outputs."""

import pytest
import torch
from torch import nn

from ecotrain.continual.gate import GatePolicy, decide, lineage_metrics, slice_metrics
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
