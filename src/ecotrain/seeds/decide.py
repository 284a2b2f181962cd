"""Seeds until the verdict decides (`--until-decided` of `fit --seeds --baseline` and `green`).

Both sides train the same seeds (paired: one seed fixes the data order and the initial weights of
each side), then `compare`'s judgement is read at look 1; while it is INCONCLUSIVE and fewer than
`max_seeds` seeds have run, one more seed trains on both sides and the judgement is read again at
the next look. Every look uses the sequential interval of stats.py (valid at every look at once),
never the fixed 95% one. Before the first added seed, the forecast of the seeds this sequential
procedure needs at the observed mean and spread (`seeds_to_decide(..., at=(1, n))`) is recorded,
so the seeds it predicted can be set beside the seeds it took. The added seeds' runs are ordinary
runs: each has its ledger, and their summed cost is reported and kept in
`PREFIX-decision.json`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional

from ecotrain.accounting.report import figure, lower_is_better, read_ledger, read_summary
from ecotrain.base.errors import ConfigError
from ecotrain.base.rundir import write_json
from ecotrain.base.stats import seeds_to_decide, sequential_interval, spread, verdict as verdict_of

DEFAULT_MAX_SEEDS = 20


@dataclass
class Decision:
    verdict: str  # PASS | FAIL | INCONCLUSIVE (the cap was reached first)
    report: str  # compare's report at the last look
    seeds: list[int]
    looks: int
    forecast: Optional[int]  # seeds per side the first look's fixed-size forecast asked for (None: no number)
    added_seeds: list[int]
    added_cost: dict  # {"baseline": ..., "candidate": ...}: the `by` figure summed over the added seeds' runs
    by: str

    def line(self) -> str:
        said = "no forecast" if self.forecast is None else f"forecast {self.forecast} seeds per side"
        return (f"decision: {self.verdict} after {len(self.seeds)} seeds per side ({self.looks} looks; {said}); "
                f"the {len(self.added_seeds)} added seeds cost {self.added_cost['baseline']:.4g} + "
                f"{self.added_cost['candidate']:.4g} {self.by}")


def check_max_seeds(first: list[int], max_seeds: int) -> None:
    if max_seeds < len(first):
        raise ConfigError(f"--max-seeds {max_seeds}: fewer than the {len(first)} seeds given to start with")
    if len(first) < 2:
        raise ConfigError("--until-decided: start with at least 2 seeds (an interval needs two), e.g. --seeds 0-2")


def next_seed(seeds: list[int], avoid: set[int]) -> int:
    s = max(seeds) + 1
    while s in avoid or s in seeds:
        s += 1
    return s


def drops(base: list[str], cand: list[str], metric: str) -> tuple[list[float], list[float]]:
    """(baseline values, candidate values) ordered so that drop = hi - lo (a loss's rise is its drop)."""
    b, c = ([read_summary(r, {metric: float})[metric] for r in runs]
            for runs in (base, cand))
    return (c, b) if lower_is_better(metric) else (b, c)


def sequential(look_at: Callable[[list[int], int], str], seeds: list[int], max_seeds: int,
               avoid: set[int] = frozenset()) -> tuple[list[int], int, str]:
    """The loop: `look_at(seeds, look)` -> verdict at look 1 on `seeds`, then one seed more per look
    while INCONCLUSIVE and fewer than `max_seeds`. Returns (seeds, looks, verdict)."""
    check_max_seeds(seeds, max_seeds)
    seeds, look = list(seeds), 1
    verdict = look_at(seeds, look)
    while verdict == "INCONCLUSIVE" and len(seeds) < max_seeds:
        seeds.append(next_seed(seeds, set(avoid)))
        look += 1
        verdict = look_at(seeds, look)
    return seeds, look, verdict


def until_decided(train: Callable[[list[int]], tuple[list[str], list[str]]], seeds: list[int], max_seeds: int,
                  judge: Callable[[list[str], list[str], int], tuple[str, str]], allowance: float, metric: str,
                  by: str, avoid: set[int] = frozenset()) -> Decision:
    """`train(seeds)` -> (baseline runs, candidate runs), in the seeds' order (runs finished before are
    kept); `judge(base, cand, look)` -> (report, verdict)."""
    seen: dict = {}

    def look_at(ss: list[int], look: int) -> str:
        base, cand = train(ss)
        seen["report"], verdict = judge(base, cand, look)
        seen["runs"] = base, cand
        if look == 1:
            hi, lo = drops(base, cand, metric)
            d = [h - w for h, w in zip(hi, lo)]
            seen["forecast"] = seeds_to_decide(sum(d) / len(d), spread(hi, lo, paired=True), allowance,
                                               at=(1, len(d)))
        return verdict

    first = len(seeds)
    seeds, looks, verdict = sequential(look_at, seeds, max_seeds, avoid)
    base, cand = seen["runs"]
    cost = {side: sum(_cost(r, by) for r in runs[first:]) for side, runs in (("baseline", base), ("candidate", cand))}
    return Decision(verdict, seen["report"], seeds, looks, seen["forecast"], seeds[first:], cost, by)


def until_decided_values(drop: Callable[[int], float], seeds: list[int], max_seeds: int, allowance: float,
                         avoid: set[int] = frozenset()) -> dict:
    """The same loop over one number per seed, `drop(seed)` (a bench's paired difference, computed
    once per seed): PASS when the sequential interval of the drops lies within `allowance`."""
    drops_by_seed: dict[int, float] = {}
    shown: dict = {}

    def look_at(ss: list[int], look: int) -> str:
        for s in ss:
            if s not in drops_by_seed:
                drops_by_seed[s] = drop(s)
        d = [drops_by_seed[s] for s in ss]
        iv = sequential_interval(d, look)
        if look == 1:
            shown["forecast"] = seeds_to_decide(iv.mean, _sd(d), allowance, at=(1, len(d)))
        shown["interval"] = iv
        return verdict_of(iv, allowance)

    seeds, looks, verdict = sequential(look_at, seeds, max_seeds, avoid)
    iv = shown["interval"]
    return {"verdict": verdict, "seeds": seeds, "looks": looks, "forecast": shown["forecast"],
            "mean": iv.mean, "low": iv.low, "high": iv.high, "drops": [drops_by_seed[s] for s in seeds]}


def _sd(xs: list[float]) -> float:
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else math.nan


def _cost(run: str, by: str) -> float:
    v = figure(read_ledger(run), by)
    return float(v) if v is not None and math.isfinite(v) else 0.0


def save(decision: Decision, path: Path) -> None:
    write_json(path, {k: v for k, v in asdict(decision).items() if k != "report"})
