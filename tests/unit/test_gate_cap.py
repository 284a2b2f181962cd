"""The gate's damage cap (kappa): each old slice may lose at most kappa on its own, at the boundary."""

import pytest

from ecotrain.continual.gate import GatePolicy, decide

BASE = {"a": 0.80, "b": 0.70, "new": 0.40}


def cand(drop_b: float) -> dict:
    return {"a": 0.85, "b": 0.70 - drop_b, "new": 0.90}


@pytest.mark.parametrize("drop,ok", [(0.0, True), (0.03, True), (0.05, True), (0.05 + 1e-9, False), (0.06, False)])
def test_cap_boundary(drop, ok):
    # the average barely moves (a gains what b loses): only the cap can refuse
    got, reason = decide(BASE, cand(drop), ["a", "b"], "new", GatePolicy(tolerance=0.5, cap=0.05))
    assert got is ok, reason
    if not ok:
        assert reason.startswith("rejected: damages one old slice beyond the cap: 'b' 0.7000 ->")
        assert "cap 0.05" in reason
    else:  # the average's figures are kept, the cap's appended
        assert "holdout 0.7500 -> " in reason and "; largest single drop 'b' 0.7000 -> " in reason


def test_cap_names_the_worst_slice_and_off_by_default():
    c = {"a": 0.60, "b": 0.69, "new": 0.90}  # a loses 0.20, b 0.01
    ok, reason = decide(BASE, c, ["a", "b"], "new", GatePolicy(tolerance=0.5, cap=0.1))
    assert not ok and "'a' 0.8000 -> 0.6000 (drop +0.2000, cap 0.1)" in reason
    assert decide(BASE, c, ["a", "b"], "new", GatePolicy(tolerance=0.5))[0]  # no cap: the average alone
    assert GatePolicy().cap is None


def test_cap_after_the_recent_slice_and_the_average():
    # the recent slice not improving is said first, whatever the cap
    ok, reason = decide(BASE, {**cand(0.0), "new": 0.40}, ["a", "b"], "new", GatePolicy(cap=0.05))
    assert not ok and reason.startswith("rejected: the recent slice did not improve")
    # gains on an old slice never count against it (max(0, before - after))
    ok, _ = decide(BASE, {"a": 0.95, "b": 0.75, "new": 0.9}, ["a", "b"], "new", GatePolicy(cap=0.0))
    assert ok
