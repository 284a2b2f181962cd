"""Seeds that decide (stats.py): the forecast of how many seeds a comparison needs, and the
sequential interval that may be looked at after every added seed without inflating its error."""

import math
import random

import pytest

from ecotrain.base.stats import (T975, look_alpha, mean_ci, seeds_to_decide, sequential_interval, spread, t_quantile,
                            verdict)

pytestmark = pytest.mark.unit


def test_the_quantile_agrees_with_the_fixed_table():
    for df in (1, 2, 5, 10, 30):
        assert t_quantile(0.975, df) == pytest.approx(T975[df - 1], abs=2e-3)
    assert t_quantile(0.995, 4) == pytest.approx(4.604, abs=1e-3)


def test_the_looks_spend_at_most_alpha_whatever_their_number():
    assert look_alpha(1) == pytest.approx(0.025) and look_alpha(2) == pytest.approx(0.05 / 6)
    assert sum(look_alpha(k) for k in range(1, 10_000)) < 0.05
    with pytest.raises(ValueError):
        look_alpha(0)


def test_a_sequential_interval_is_wider_than_the_fixed_one_at_every_look():
    xs = [0.3, -0.1, 0.5, 0.2, 0.4, 0.0]
    fixed = mean_ci(xs)
    for look in (1, 2, 5):
        iv = sequential_interval(xs, look)
        assert iv.mean == pytest.approx(fixed.mean) and iv.half > fixed.half
    assert sequential_interval(xs, 5).half > sequential_interval(xs, 2).half


def _error_rate(interval, trials, seed):
    """At a true mean drop equal to the allowance any PASS or FAIL is an error: the share of trials
    that 'decided' while adding seeds one at a time from 3 to 20, looking after each."""
    r, errors = random.Random(seed), 0
    for _ in range(trials):
        xs = [r.gauss(1.0, 1.0) for _ in range(3)]
        look = 1
        while verdict(interval(xs, look), 1.0) == "INCONCLUSIVE" and len(xs) < 20:
            xs.append(r.gauss(1.0, 1.0))
            look += 1
        errors += verdict(interval(xs, look), 1.0) != "INCONCLUSIVE"
    return errors / trials


def test_looking_after_every_seed_keeps_its_error_rate_only_with_the_sequential_interval():
    naive = _error_rate(lambda xs, look: mean_ci(xs), 1500, 7)  # a fixed 95% interval re-tested every seed
    honest = _error_rate(sequential_interval, 1500, 7)
    assert naive > 0.15  # about 0.23: re-testing a fixed interval decides by chance
    assert honest <= 0.05  # about 0.03: the union bound holds


def test_seeds_to_decide_is_the_hand_computed_count():
    # paired differences 0.005, 0.005, 0.010: mean 0.00667, sd 0.00289; allowance 0.01, gap 0.00333:
    # n = 5 gives 2.776 * 0.00289 / sqrt(5) = 0.00359 (too wide), n = 6 gives 2.571 * 0.00289 / sqrt(6) = 0.00303
    sd = spread([0.905, 0.925, 0.92], [0.9, 0.92, 0.91], paired=True)
    assert sd == pytest.approx(0.002887, abs=1e-6)
    assert seeds_to_decide(0.02 / 3, sd, 0.01) == 6
    assert seeds_to_decide(0.01, sd, 0.01) is None  # a mean at the allowance never decides
    assert seeds_to_decide(0.0, 0.0, 0.01) == 2
    assert seeds_to_decide(0.0, 1.0, 0.01, cap=50) is None
    assert seeds_to_decide(0.0, math.nan, 0.01) is None
    assert spread([1.0, 2.0], [1.0, 1.0], paired=False) == pytest.approx(math.sqrt(0.5))


def test_the_sequential_forecast_is_the_first_count_whose_look_interval_decides():
    """At look L with n seeds a sequential comparison reaches n' seeds at look L + n' - n, whose interval
    is wider than the fixed one: its forecast is the first n' where that look's half-width clears the gap,
    more seeds than the fixed forecast, and never fewer than the seeds already run."""
    mean, sd, allowance = 0.007875, 0.0064577, 0.01
    fixed = seeds_to_decide(mean, sd, allowance)
    seq = seeds_to_decide(mean, sd, allowance, at=(38, 40))
    assert fixed is not None and seq is not None and seq > max(fixed, 40)
    half = lambda n: t_quantile(1 - look_alpha(38 + n - 40) / 2, n - 1) * sd / math.sqrt(n)  # noqa: E731
    assert half(seq) < allowance - mean <= half(seq - 1)
    assert seeds_to_decide(0.0, 0.001, 0.01, at=(3, 5)) == 5  # decided already at the present look
    assert seeds_to_decide(0.0, 0.1, 0.01, at=(1, 3), cap=50) is None


# ---- decide.until_decided: real run folders (summary.json, ledger.json), compare's judgement ----
def _runs(tmp_path, accs: dict):
    """A `train(seeds)` over prepared accuracies {seed: (baseline, candidate)}: each seed's two run
    folders are written the first time it is asked for, as a real pair of seed groups would be."""
    from tests.unit.test_accounting_compare import make_run

    trained = []

    def train(seeds):
        for s in seeds:
            if s not in trained:
                b, c = accs[s]
                make_run(tmp_path / f"b{s}", b, 1.0, flops=2e9, seed=s)
                make_run(tmp_path / f"c{s}", c, 0.4, flops=1e9, seed=s)
                trained.append(s)
        return [str(tmp_path / f"b{s}") for s in seeds], [str(tmp_path / f"c{s}") for s in seeds]
    return train, trained


def _judge(base, cand, look):
    from ecotrain.accounting.compare import judge

    return judge(base, cand, 0.01, 0.5, "flops", "test_accuracy", look)


def test_seeds_are_added_until_the_verdict_decides(tmp_path):
    from ecotrain.seeds.decide import until_decided

    rng = random.Random(3)  # per-seed drops around 0.002, spread 0.004: the first 3 straddle 0.01
    accs = {s: (0.9, 0.9 - d) for s, d in enumerate([0.009, -0.002, 0.006] + [rng.gauss(0.002, 0.004) for _ in range(17)])}
    train, trained = _runs(tmp_path, accs)
    d = until_decided(train, [0, 1, 2], 20, _judge, 0.01, "test_accuracy", "flops")
    assert d.verdict == "PASS" and d.looks == len(d.seeds) - 2 and d.seeds == list(range(len(d.seeds)))
    assert 3 < len(d.seeds) <= 20 and trained == d.seeds and d.added_seeds == d.seeds[3:]
    assert d.forecast is not None and "sequential look" in d.report
    assert d.added_cost == {"baseline": 2e9 * len(d.added_seeds), "candidate": 1e9 * len(d.added_seeds)}


def test_the_cap_ends_an_undecided_comparison_and_a_clear_one_takes_no_more_seeds(tmp_path):
    from ecotrain.seeds.decide import until_decided

    at_allowance = {s: (0.9, 0.9 - 0.01 + (0.004 if s % 2 else -0.004)) for s in range(6)}
    train, _ = _runs(tmp_path / "a", at_allowance)
    d = until_decided(train, [0, 1], 5, _judge, 0.01, "test_accuracy", "flops")
    assert d.verdict == "INCONCLUSIVE" and d.seeds == [0, 1, 2, 3, 4] and d.looks == 4
    clear = {s: (0.9, 0.9 - 0.05 - 0.001 * s) for s in range(4)}
    train, trained = _runs(tmp_path / "b", clear)
    d = until_decided(train, [0, 1, 2], 20, _judge, 0.01, "test_accuracy", "flops")
    assert d.verdict == "FAIL" and d.seeds == [0, 1, 2] and trained == [0, 1, 2] and d.added_seeds == []


def test_the_values_loop_computes_each_seed_once_and_stops_when_decided():
    from ecotrain.seeds.decide import until_decided_values

    calls = []

    def drop(seed):
        calls.append(seed)
        return 0.05 + 0.01 * ((seed * 7) % 5 - 2)  # about 0.05, well under an allowance of 0.15

    d = until_decided_values(drop, [50, 51], 20, 0.15, avoid={52})
    assert d["verdict"] == "PASS" and d["seeds"][:2] == [50, 51] and 52 not in d["seeds"]
    assert calls == d["seeds"] and d["looks"] == len(d["seeds"]) - 1 and d["high"] <= 0.15
    assert until_decided_values(lambda s: 0.15 + (0.01 if s % 2 else -0.01), [0, 1], 4, 0.15)["verdict"] == "INCONCLUSIVE"
