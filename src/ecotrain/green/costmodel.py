"""A fitted cost model for `ecotrain green`: a trial's measured cost ratio predicted from its values
before it trains, from the trials measured so far, so that a trial that cannot beat the cheapest
feasible one is not trained (search.py). Counted FLOPs need no model (space.predicted_cost knows
them for the schedule and batch levers); a measured energy, CO2e or money ratio does: the width,
pruning and selective backprop move it by amounts that depend on the machine.

The model is a least-squares fit of the log of each complete trial's load-corrected ratio on the
logs of its values (samples fraction, batch fraction, width, kept fraction) and the on/off levers
(prune amount, EMA, stability stop), each feature kept only when it varies among the measured
trials; a trial whose value of a feature that never varied differs is not predicted at all. Its band is its leave-one-out error: every measured trial predicted by a fit on the others.
A trial is skipped only when even the band's cheap end, exp(prediction - Z x leave-one-out RMS),
is no cheaper than the best feasible ratio, and only once MIN_TRIALS trials leave at least
SPARE more than the model has coefficients: a guess never prunes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

MIN_TRIALS = 5  # complete trials measured before the model may skip one
SPARE = 2  # measured trials beyond the model's coefficients (leave-one-out needs some left over)
Z = 2.5  # the band's width in leave-one-out RMS errors: a log-linear fit misses a curved cost law at its edges


def features(params: dict, base_batch: int) -> list[float]:
    """One trial's values as the model reads them (space.suggest's keys; a lever not searched is off)."""
    return [math.log(params.get("samples", 1.0)),
            math.log(params.get("batch", base_batch) / base_batch),
            math.log(params.get("width", 1.0)),
            math.log(params.get("depth", 1.0)),
            float(params.get("fidelity", 0.0)),
            float(params.get("prune", 0.0)),
            math.log(params.get("keep", 1.0)),
            float(bool(params.get("ema"))),
            float(bool(params.get("stability")))]


@dataclass
class Fit:
    coef: np.ndarray  # intercept first
    columns: list[int]  # the features that varied among the measured trials
    loo_rms: float  # leave-one-out RMS error of log(ratio)
    n: int
    fixed: dict  # {feature: the value every measured trial had}: the model knows nothing of another value

    def covers(self, params: dict, base_batch: int) -> bool:
        """The trial's values lie where the model was measured: no feature it never saw vary differs."""
        x = features(params, base_batch)
        return all(abs(x[j] - v) <= 1e-12 for j, v in self.fixed.items())

    def predict(self, params: dict, base_batch: int) -> float:
        """The predicted ratio (the centre of the band)."""
        return float(math.exp(self._log(params, base_batch)))

    def cheapest(self, params: dict, base_batch: int) -> float:
        """The band's cheap end: a trial is no cheaper than this unless the model is wrong."""
        return float(math.exp(self._log(params, base_batch) - Z * self.loo_rms))

    def _log(self, params: dict, base_batch: int) -> float:
        x = np.asarray(features(params, base_batch))[self.columns]
        return float(self.coef[0] + x @ self.coef[1:])


def fit(measured: Sequence[tuple[dict, float]], base_batch: int) -> Optional[Fit]:
    """The model of (values, load-corrected ratio) pairs of complete trials; None while too few are
    measured for a leave-one-out band (module doc) or a ratio is not a positive number."""
    rows = [(p, r) for p, r in measured if r is not None and math.isfinite(r) and r > 0]
    if len(rows) < MIN_TRIALS:
        return None
    X = np.asarray([features(p, base_batch) for p, _ in rows])
    y = np.log([r for _, r in rows])
    columns = [j for j in range(X.shape[1]) if np.ptp(X[:, j]) > 1e-12]
    A = np.hstack([np.ones((len(rows), 1)), X[:, columns]])
    if len(rows) < A.shape[1] + SPARE or np.linalg.matrix_rank(A) < A.shape[1]:
        return None  # more coefficients than the trials can pin down (or two features move together)
    coef = np.linalg.lstsq(A, y, rcond=None)[0]
    errors = []
    for i in range(len(rows)):  # leave one out: how far the model misses a trial it has not seen
        keep = np.arange(len(rows)) != i
        if np.linalg.matrix_rank(A[keep]) < A.shape[1]:
            return None  # one trial alone pins a coefficient: no honest band
        c = np.linalg.lstsq(A[keep], y[keep], rcond=None)[0]
        errors.append(float(A[i] @ c - y[i]))
    fixed = {j: float(X[0, j]) for j in range(X.shape[1]) if j not in columns}
    return Fit(coef, columns, float(np.sqrt(np.mean(np.square(errors)))), len(rows), fixed)


def hindsight(rows) -> dict:
    """How well the model did in this search: the trials it predicted before they trained, against what
    they then measured (complete trials only: a pruned one stopped early), and the trials it skipped."""
    pairs = [(r.predicted, r.ratio) for r in rows if r.predicted is not None and r.ratio and r.state == "complete"]
    errors = sorted(abs(p / m - 1) for p, m in pairs)
    return {"predicted": len(pairs), "median_abs_error": errors[len(errors) // 2] if errors else None,
            "skipped": sum(1 for r in rows if r.state == "skipped" and "fitted cost model" in r.why)}
