"""The fitted cost model of `ecotrain green` (green/costmodel.py): it predicts a trial's measured cost
ratio from its values once enough trials were measured, its band comes from leave-one-out errors, and it
refuses to predict when the trials cannot pin its coefficients down."""

import math
import random

import pytest

from ecotrain.green import costmodel
from ecotrain.assembly.green_search import Options, Row, Search, predict


def law(p: dict) -> float:
    """A machine's cost: a fixed start-up share plus work that scales with samples and width squared."""
    return 0.08 + 0.92 * p["samples"] * p.get("width", 1.0) ** 2 * (0.55 if p.get("keep", 1.0) < 1 else 1.0)


def trials(n: int, seed: int, noise: float = 0.03) -> list[tuple[dict, float]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        p = {"samples": round(math.exp(rng.uniform(math.log(0.1), math.log(0.5))), 3),
             "width": rng.choice([0.6, 0.8, 1.0]), "keep": rng.choice([1.0, 0.5])}
        out.append((p, law(p) * math.exp(rng.gauss(0, noise))))
    return out


def test_too_few_trials_predict_nothing():
    assert costmodel.fit(trials(costmodel.MIN_TRIALS - 1, 1), 64) is None


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_it_predicts_an_unseen_trial_and_its_band_holds_it(seed):
    model = costmodel.fit(trials(10, seed), 64)
    assert model is not None and model.n == 10
    for p, measured in trials(20, seed + 100, noise=0.0):
        assert model.cheapest(p, 64) < model.predict(p, 64)
        assert model.predict(p, 64) == pytest.approx(measured, rel=0.4)  # a log-linear fit of a curved law
        assert model.cheapest(p, 64) <= measured * 1.02


def test_features_that_move_together_are_refused_not_guessed():
    # samples and batch always change together: the fit cannot tell their effects apart
    rows = [({"samples": s, "batch": int(128 * s)}, s) for s in (0.125, 0.25, 0.5, 0.125, 0.25, 0.5, 0.25)]
    assert costmodel.fit(rows, 64) is None


def test_non_finite_or_missing_ratios_are_left_out():
    good = trials(6, 7)
    bad = [({"samples": 0.2}, float("nan")), ({"samples": 0.3}, None), ({"samples": 0.4}, -1.0),
           ({"samples": 0.2}, float("inf"))]
    a, b = costmodel.fit(good, 64), costmodel.fit(good + bad, 64)
    assert a is not None and b is not None and b.n == a.n == 6
    assert b.predict({"samples": 0.2}, 64) == a.predict({"samples": 0.2}, 64)


def test_the_search_asks_the_model_for_a_measured_cost_and_counts_flops():
    search = Search(baseline={"val": 0.9, "cost": 1.0, "flops": 1.0, "samples": 100})
    for i, (p, r) in enumerate(trials(8, 11)):
        search.rows.append(Row(i, "complete", p, [], ratio=r))
    search.rows.append(Row(8, "pruned", {"samples": 0.5}, [], ratio=0.01))  # stopped early: not a full cost
    energy, flops = Options("r.yaml", [], out=None, by="energy"), Options("r.yaml", [], out=None, by="flops")
    p = {"samples": 0.3, "width": 0.8, "keep": 1.0}
    predicted, cheapest = predict(energy, search, p, 64)
    assert predicted == pytest.approx(law(p), rel=0.4) and cheapest < predicted
    assert predict(flops, search, {"samples": 0.3}, 64) == (0.3, 0.3)  # counted, exact: no band
    assert predict(flops, search, p, 64) == (None, None)  # width changes the FLOPs per sample


def test_hindsight_counts_the_predictions_and_the_skips():
    rows = [Row(0, "complete", {}, [], ratio=0.5, predicted=0.55), Row(1, "complete", {}, [], ratio=0.4, predicted=0.38),
            Row(2, "pruned", {}, [], ratio=0.1, predicted=0.4),
            Row(3, "skipped", {}, [], why="predicted 0.6x ... (the fitted cost model's cheap end: 0.5x)")]
    got = costmodel.hindsight(rows)
    assert got["predicted"] == 2 and got["skipped"] == 1
    assert got["median_abs_error"] == pytest.approx(0.1)


def test_a_lever_value_never_measured_is_not_predicted():
    # every measured trial kept the full width: the model cannot say what width 0.6 costs
    rows = [(dict(p, width=1.0), law(dict(p, width=1.0))) for p, _ in trials(8, 21)]
    model = costmodel.fit(rows, 64)
    assert model is not None and model.covers({"samples": 0.3, "width": 1.0, "keep": 1.0}, 64)
    assert not model.covers({"samples": 0.3, "width": 0.6, "keep": 1.0}, 64)
    search = Search(baseline={"val": 0.9, "cost": 1.0, "flops": 1.0, "samples": 100})
    search.rows += [Row(i, "complete", p, [], ratio=r) for i, (p, r) in enumerate(rows)]
    energy = Options("r.yaml", [], out=None, by="energy")
    assert predict(energy, search, {"samples": 0.3, "width": 0.6, "keep": 1.0}, 64) == (None, None)
    assert predict(energy, search, {"samples": 0.3, "width": 1.0, "keep": 1.0}, 64)[0] is not None
