"""The pruner of `ecotrain green` (search.py): each trial reports its deficit to the baseline's validation
curve at the same fraction of its schedule (`Reporter`), and `gap_pruner` stops it from WARMUP% on when
that deficit is past the tolerance plus a slack that shrinks to zero at the end, widened for a schedule
of fewer steps than the baseline's (`pace`) and held off while a mixed-fidelity trial's inputs are still
half size (its `prune_from`)."""

from __future__ import annotations

from typing import Optional

from ecotrain.accounting.report import lower_is_better
from ecotrain.callbacks import Callback

try:  # the `green` extra; search.need_optuna says so in one line before anything here runs
    import optuna
except ImportError:  # pragma: no cover
    optuna = None

SLACK = 0.08  # the pruner's allowance above the tolerance at 0% of the schedule, falling to 0 at 100%
WARMUP = 50  # percent of the schedule before the pruner may act


def higher_is_better(metric: str) -> bool:
    return not lower_is_better(metric)


def at(curve: list[tuple[float, float]], p: float) -> Optional[float]:
    """The curve at fraction p, linearly between its points (None before its first point)."""
    before = [pt for pt in curve if pt[0] <= p]
    after = [pt for pt in curve if pt[0] >= p]
    if not before:
        return None
    if not after:
        return before[-1][1]
    (p0, v0), (p1, v1) = before[-1], after[0]
    return v0 if p1 == p0 else v0 + (v1 - v0) * (p - p0) / (p1 - p0)


class Reporter(Callback):
    """Reports each evaluation's deficit to the Optuna trial and stops the run when the pruner says so."""

    def __init__(self, trial, curve, metric: str, reported=(), base_steps: int = 0):
        self.trial, self.curve, self.metric, self.base_steps = trial, curve, metric, base_steps
        self.reported = set(reported)  # steps an earlier try of this trial reported already
        self.sign = 1.0 if higher_is_better(metric) else -1.0
        self.pruned_at: Optional[int] = None

    def on_eval_end(self, state, record):
        if self.metric not in record or not state.total_steps:
            return
        pct = round(100 * state.step / state.total_steps)
        base = at(self.curve, state.step / state.total_steps)
        if base is None:
            return
        deficit = self.sign * (base - float(record[self.metric]))
        if "pace" not in self.trial.user_attrs and self.base_steps:  # once; a resumed trial computes the same
            self.trial.set_user_attr("pace", pace(self.base_steps, state.total_steps))
        if pct not in self.reported:  # a resumed trial does not report a step twice
            self.trial.report(deficit, pct)
            self.reported.add(pct)
        if self.trial.should_prune():
            self.pruned_at = pct
            state.stop("pruned")


def pace(base_steps: int, trial_steps: int) -> float:
    """How much more a trial may still gain late in its schedule than the baseline did: the square root
    of the baseline's optimizer steps over the trial's, at least 1. At the same fraction of a cosine
    schedule a run of fewer, larger steps has taken fewer updates and is further behind the baseline
    than where it ends (the search's batch-500 trials: 0.02-0.13 behind at 50-75%, the hand-chosen
    recipe of that kind 0.002 behind at its end), so its allowance is widened by this factor."""
    return max(1.0, (base_steps / max(1, trial_steps)) ** 0.5)


def gap_pruner(tolerance: float):
    """Prune from WARMUP% of the schedule on (a mixed-fidelity trial: once its inputs are full size, the
    trial's `prune_from`), when the deficit to the baseline's curve at the same
    fraction exceeds tolerance + SLACK x (1 - fraction) x the trial's `pace` (1 unless it is a shorter
    schedule than the baseline's in optimizer steps)."""

    class GapPruner(optuna.pruners.BasePruner):
        def prune(self, study, trial) -> bool:
            step = trial.last_step
            if step is None or step < max(WARMUP, trial.user_attrs.get("prune_from", 0)) or step >= 100:
                return False
            slack = SLACK * (1 - step / 100) * float(trial.user_attrs.get("pace", 1.0))
            return trial.intermediate_values[step] > tolerance + slack

    return GapPruner()
