"""Means and 95% intervals over seeds: the one place every bench and `ecotrain compare` gets them
(docs/evaluation.md). Student's t, no SciPy: the quantiles below are t(0.975, df) for df 1-30;
beyond that the normal 1.96 is within 2% of t.

A comparison of two seed groups is paired when both ran the same seeds (each seed's difference,
so the seed-to-seed spread that both sides share cancels), else Welch's unequal-variance interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)


def t975(df: float) -> float:
    """The 97.5% quantile of Student's t with `df` degrees of freedom (fractional df: the next lower)."""
    if df < 1:
        return math.inf
    k = int(df)
    return T975[k - 1] if k <= len(T975) else 1.96


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float
    n: int

    @property
    def half(self) -> float:
        return (self.high - self.low) / 2

    def __str__(self) -> str:
        return f"{self.mean:.4f} [{self.low:.4f}, {self.high:.4f}] (n={self.n})"


def mean_ci(values: Sequence[float]) -> Interval:
    """Mean and 95% t-interval of `values` (one value: no interval, both bounds infinite)."""
    xs = [float(v) for v in values]
    n = len(xs)
    if n == 0:
        raise ValueError("mean_ci: no values")
    m = sum(xs) / n
    if n == 1:
        return Interval(m, -math.inf, math.inf, 1)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    h = t975(n - 1) * sd / math.sqrt(n)
    return Interval(m, m - h, m + h, n)


def diff_ci(base: Sequence[float], cand: Sequence[float], paired: bool) -> Interval:
    """95% interval of mean(base) - mean(cand): paired by position (the same seeds), or Welch's."""
    if paired:
        if len(base) != len(cand):
            raise ValueError("diff_ci: a paired comparison needs as many values on each side")
        return mean_ci([b - c for b, c in zip(base, cand)])
    a, b = mean_ci(base), mean_ci(cand)
    na, nb = len(base), len(cand)
    if na < 2 or nb < 2:
        return Interval(a.mean - b.mean, -math.inf, math.inf, min(na, nb))
    va = sum((x - a.mean) ** 2 for x in base) / (na - 1) / na
    vb = sum((x - b.mean) ** 2 for x in cand) / (nb - 1) / nb
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / ((va * va / (na - 1) if va else 0) + (vb * vb / (nb - 1) if vb else 0)) if se else na + nb - 2
    h = t975(df) * se
    d = a.mean - b.mean
    return Interval(d, d - h, d + h, min(na, nb))


def verdict(drop: Interval, allowance: float) -> str:
    """PASS when the whole interval of the drop is within the allowance, FAIL when the whole interval
    is beyond it, INCONCLUSIVE when it straddles the allowance (more seeds would tell)."""
    if drop.high <= allowance + 1e-12:
        return "PASS"
    return "FAIL" if drop.low > allowance + 1e-12 else "INCONCLUSIVE"


def pareto_front(items, x, y) -> list:
    """The items no other beats on both `x(item)` and `y(item)` (both smaller is better), by rising x."""
    front, best = [], math.inf
    for item in sorted(items, key=lambda i: (x(i), y(i))):
        if y(item) < best:
            front.append(item)
            best = y(item)
    return front
