"""The chosen recipe and the baseline, confirmed on fresh seeds; the search's whole cost and its payback.

Both sides train on the fresh seeds as `ecotrain fit --seeds` groups (sweep.fit_seeds, each test
split read once, at the end of its run), in pairs seed by seed, the order flipped every other seed
(A B, B A, ...), so the machine's load falls on both sides alike: the baseline as the recipe and overrides given, the green
side as OUT/green.yaml itself, so what is confirmed is the file the user gets. The verdict is
`ecotrain compare`'s (accounting/compare.py: means, 95% intervals, paired by seed). Nothing here
feeds back into the choice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from ecotrain.accounting.compare import judge
from ecotrain.seeds.decide import Decision, until_decided
from ecotrain.config import load_config
from ecotrain.assembly.entry import fit_recipe
from ecotrain.accounting.report import figure, lower_is_better, read_ledger, read_summary
from ecotrain.base.errors import ConfigError, PreemptedError
from ecotrain.base.stats import Interval, diff_ci
from ecotrain.base.groupfile import group_paths, read_group
from ecotrain.seeds.sweep import fit_seeds, parse_seeds


@dataclass
class Confirmation:
    base_group: Path
    green_group: Path
    report: str  # compare's table and verdict lines
    passed: bool
    verdict: str  # PASS | FAIL | INCONCLUSIVE
    drop: Interval  # of the test metric, baseline - green, over the fresh seeds
    cost_ratio: float  # mean green cost / mean baseline cost (the `by` figure)
    saving: float  # mean baseline cost - mean green cost, per production run
    base_cost: float
    costs: dict  # "baseline" / "green": that group's summed `by` figure
    decision: Optional[Decision] = None  # --until-decided: the looks, the seeds, the forecast


def fit_group(recipe: str, overrides: list[str], prefix: Path, seeds: str, preemption=None) -> Path:
    """`ecotrain fit RECIPE OVERRIDES --seeds SEEDS --run-dir PREFIX --resume auto --quiet`, in process
    (entry.fit_recipe per seed, as the command runs it)."""
    def one(seed_overrides, run_dir) -> int:
        return fit_recipe(recipe, seed_overrides, run_dir, quiet=True, resume="auto", preemption=preemption)

    code = fit_seeds(recipe, overrides, seeds, prefix, load_config(recipe, overrides).name, resume="auto", fit_one=one)
    if code != 0:
        raise PreemptedError(f"confirmation group {prefix} stopped (exit {code}); run the same `ecotrain green` "
                             "command again to continue it")
    return group_paths(prefix, parse_seeds(seeds))[0]


def confirm(recipe: str, overrides: list[str], green_yaml: Path, out: Path, seeds: str, tolerance: float,
            by: str, min_cost_cut: float, metric: str = "test_accuracy", preemption=None,
            max_seeds: Optional[int] = None, avoid: Sequence[int] = ()) -> Confirmation:
    """`max_seeds`: until decided (decide.py): one more fresh seed per side per look, never one of
    `avoid` (the design seeds), up to `max_seeds` per side."""
    def train(ss: list[int]) -> tuple[list[str], list[str]]:
        sides = [(recipe, overrides, out / "confirm" / "baseline"), (str(green_yaml), [], out / "confirm" / "green")]
        for i, seed in enumerate(ss):  # in pairs, the order flipped every other seed: A B, B A, ... (load on both)
            for r, o, prefix in sides[:: 1 if i % 2 == 0 else -1]:
                fit_group(r, o, prefix, str(seed), preemption)
        text = ",".join(map(str, ss))  # every run is finished: the groups are written, nothing trains again
        base_g = fit_group(recipe, overrides, out / "confirm" / "baseline", text, preemption)
        green_g = fit_group(str(green_yaml), [], out / "confirm" / "green", text, preemption)
        return read_group(base_g), read_group(green_g)

    def judged(base, green, look):
        return judge(base, green, tolerance, min_cost_cut, by, metric, look)

    decision = None
    if max_seeds is None:
        base_runs, green_runs = train(parse_seeds(seeds))
        report, verdict = judged(base_runs, green_runs, None)
    else:
        decision = until_decided(train, parse_seeds(seeds), max_seeds, judged, tolerance, metric, by, set(avoid))
        base_runs, green_runs = train(decision.seeds)  # every run is finished: nothing trains again
        report, verdict = decision.report + "\n" + decision.line(), decision.verdict
    bc, gc = ([float(figure(read_ledger(r), by) or 0.0) for r in runs] for runs in (base_runs, green_runs))
    b, g = ([read_summary(r, {metric: float})[metric] for r in runs]
            for runs in (base_runs, green_runs))
    drop = diff_ci(g, b, paired=True) if lower_is_better(metric) else diff_ci(b, g, paired=True)  # same seeds, same order
    return Confirmation(group_paths(out / "confirm" / "baseline", [])[0], group_paths(out / "confirm" / "green", [])[0],
                        report, verdict == "PASS", verdict, drop, (sum(gc) / len(gc)) / (sum(bc) / len(bc)),
                        sum(bc) / len(bc) - sum(gc) / len(gc), sum(bc) / len(bc),
                        {"baseline": sum(bc), "green": sum(gc)}, decision)


def payback_runs(search_cost: float, saving_per_run: float) -> Optional[int]:
    """Production runs of the green recipe (instead of the baseline) that repay the search's cost:
    ceil(search cost / saving per run); None when a run saves nothing (it never pays back)."""
    if saving_per_run <= 0:
        return None
    if search_cost < 0:
        raise ValueError("payback_runs: a negative search cost")
    return max(0, math.ceil(search_cost / saving_per_run - 1e-9))


def check_seeds(design: list[int], fresh: str) -> list[int]:
    seeds = parse_seeds(fresh)
    both = sorted(set(design) & set(seeds))
    if both:
        raise ConfigError(f"--seeds-confirm {fresh}: includes design seed {both[0]}; confirmation needs fresh "
                          "seeds, disjoint from --seed and --check-seeds (docs/evaluation.md), e.g. 10-14")
    if len(seeds) < 2:
        raise ConfigError(f"--seeds-confirm {fresh}: at least 2 fresh seeds for an interval (5 for a headline)")
    return seeds


def cost_sum(runs: Sequence[str], by: str) -> float:
    return sum(float(figure(read_ledger(r), by) or 0.0) for r in runs)
