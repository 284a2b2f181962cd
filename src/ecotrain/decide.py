"""Seeds until the verdict decides (`--until-decided` of `fit --seeds --baseline` and `green`).

Both sides train the same seeds (paired: one seed fixes the data order and the initial weights of
each side), then `compare`'s judgement is read at look 1; while it is INCONCLUSIVE and fewer than
`max_seeds` seeds have run, one more seed trains on both sides and the judgement is read again at
the next look. Every look uses the sequential interval of stats.py (valid at every look at once),
never the fixed 95% one. Before the first added seed, the fixed-size forecast (`seeds_to_decide`)
is recorded, so the seeds it predicted can be set beside the seeds it took. The added seeds' runs
are ordinary runs: each has its ledger, and their summed cost is reported and kept in
`PREFIX-decision.json`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional

from ecotrain.accounting.report import figure, read_ledger
from ecotrain.errors import ConfigError
from ecotrain.jsonfile import read_json
from ecotrain.rundir import write_json
from ecotrain.stats import seeds_to_decide, spread

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
    b, c = ([read_json(Path(r) / "summary.json", "run summary", {metric: float})[metric] for r in runs]
            for runs in (base, cand))
    return (b, c) if "loss" not in metric else (c, b)


def until_decided(train: Callable[[list[int]], tuple[list[str], list[str]]], seeds: list[int], max_seeds: int,
                  judge: Callable[[list[str], list[str], int], tuple[str, str]], allowance: float, metric: str,
                  by: str, avoid: set[int] = frozenset()) -> Decision:
    """`train(seeds)` -> (baseline runs, candidate runs), in the seeds' order (runs finished before are
    kept); `judge(base, cand, look)` -> (report, verdict)."""
    check_max_seeds(seeds, max_seeds)
    seeds = list(seeds)
    base, cand = train(seeds)
    look, forecast, first = 1, None, len(seeds)
    report, verdict = judge(base, cand, look)
    hi, lo = drops(base, cand, metric)
    d = [h - w for h, w in zip(hi, lo)]
    forecast = seeds_to_decide(sum(d) / len(d), spread(hi, lo, paired=True), allowance)
    while verdict == "INCONCLUSIVE" and len(seeds) < max_seeds:
        seeds.append(next_seed(seeds, set(avoid)))
        base, cand = train(seeds)
        look += 1
        report, verdict = judge(base, cand, look)
    added = seeds[first:]
    cost = {side: sum(_cost(r, by) for r in runs[first:]) for side, runs in (("baseline", base), ("candidate", cand))}
    return Decision(verdict, report, seeds, look, forecast, added, cost, by)


def _cost(run: str, by: str) -> float:
    v = figure(read_ledger(run), by)
    return float(v) if v is not None and math.isfinite(v) else 0.0


def save(decision: Decision, path: Path) -> None:
    write_json(path, {k: v for k, v in asdict(decision).items() if k != "report"})
