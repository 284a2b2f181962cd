"""Means and 95% intervals over seeds: the one place every bench and `ecotrain compare` gets them
(docs/evaluation.md). Student's t, no SciPy: the quantiles below are t(0.975, df) for df 1-30;
beyond that the normal 1.96 is within 2% of t.

A comparison of two seed groups is paired when both ran the same seeds (each seed's difference,
so the seed-to-seed spread that both sides share cancels), else Welch's unequal-variance interval.

Two questions about seeds (docs/evaluation.md):
- `seeds_to_decide`: how many seeds per side a comparison would need for its interval, at the
  observed mean and spread, to lie wholly on one side of the allowance (a fixed-size comparison's
  95% interval, or a sequential one's interval at the look it would reach): a forecast, said with
  an INCONCLUSIVE verdict.
- `sequential_interval`: a comparison that adds seeds until it decides looks at the data again and
  again; re-testing a fixed 95% interval after every seed would make some "decision" likely by
  chance. Look k (k = 1, 2, ...) instead uses a (1 - a_k) t-interval with a_k = 0.05 / (k (k + 1)):
  the a_k sum to 0.05 over any number of looks, so by the union bound the chance that any look's
  interval misses the true mean is at most 5% (an alpha-spending group-sequential design, Lan &
  DeMets 1983, with a Bonferroni split over the looks: conservative, valid for every stopping rule).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Optional, Sequence

ALPHA = 0.05
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
    level: float = 1 - ALPHA  # the interval's coverage: 0.95, or a sequential look's wider one

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


@functools.lru_cache(maxsize=4096)
def t_quantile(p: float, df: float) -> float:
    """The `p` quantile of Student's t (any p, any df >= 1), from SciPy (scikit-learn's dependency)."""
    if df < 1:
        return math.inf
    from scipy.stats import t as student_t  # here only: the fixed 95% path needs no SciPy import

    return float(student_t.ppf(p, df))


def look_alpha(look: int, alpha: float = ALPHA) -> float:
    """The error spent at look `look` (1, 2, ...): alpha / (look (look + 1)), summing to alpha."""
    if look < 1:
        raise ValueError("look_alpha: looks count from 1")
    return alpha / (look * (look + 1))


def sequential_interval(diffs: Sequence[float], look: int) -> Interval:
    """The interval of the mean of paired `diffs` at look `look` of a sequential comparison: valid at
    every look at once (see the module's docstring)."""
    xs = [float(v) for v in diffs]
    n = len(xs)
    m = sum(xs) / n
    if n < 2:
        return Interval(m, -math.inf, math.inf, n, 1 - look_alpha(look))
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    h = t_quantile(1 - look_alpha(look) / 2, n - 1) * sd / math.sqrt(n)
    return Interval(m, m - h, m + h, n, 1 - look_alpha(look))


def seeds_to_decide(mean: float, sd: float, allowance: float, cap: int = 1000,
                    at: Optional[tuple[int, int]] = None) -> int | None:
    """Seeds per side (paired: per-seed differences of spread `sd`) at which a 95% interval around
    `mean` would lie wholly within or wholly beyond `allowance`; None when no number up to `cap`
    would (a mean at the allowance never decides). `at=(look, n)`: a sequential comparison now at
    look `look` with `n` seeds, adding one seed per look: the count at which *its* interval (the
    look's wider one, `sequential_interval`) would decide, never fewer than `n`. Without `at`, a
    fixed-size comparison's count. A forecast: the next seeds move the mean."""
    gap = abs(allowance - mean)
    if not (math.isfinite(gap) and math.isfinite(sd)) or gap <= 1e-12:
        return None
    for n in range(2 if at is None else max(2, at[1]), cap + 1):
        q = t975(n - 1) if at is None else t_quantile(1 - look_alpha(at[0] + n - at[1]) / 2, n - 1)
        if q * sd / math.sqrt(n) < gap:
            return n
    return None


def spread(base: Sequence[float], cand: Sequence[float], paired: bool) -> float:
    """The spread of one seed's difference: the paired differences' sd, or (unpaired) sqrt(sa^2 + sb^2)."""
    def sd(xs):
        m = sum(xs) / len(xs)
        return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else math.nan
    if paired:
        return sd([b - c for b, c in zip(base, cand)])
    return math.sqrt(sd(list(base)) ** 2 + sd(list(cand)) ** 2)


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
