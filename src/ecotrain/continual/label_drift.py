"""Label drift over rounds: an annotator (or a cohort's labelling) whose labels change convention or
quality from one round to the next, flagged against its own history.

The witness is the current model: per label it predicts a class. A model's own mistakes are a steady
share of disagreement that the test compares with itself, so only a change shows:
- **quality**: the share of an annotator's labels the model disagrees with, this round against the
  rounds before (one-sided Fisher's exact test: worse, not better, is an alarm);
- **convention**: per label class c and predicted class d != c, the share of the annotator's c-labels
  the model reads as d, this round against before (the same test on each pair): an annotator who
  starts writing 5 for what used to be 3 moves mass onto one pair long before the overall share moves.
Each round's tests are Bonferroni-corrected: half of `alpha` over the annotators' quality tests, half
over their class pairs, so `alpha` bounds the chance of any false alarm in a round (for labels as
steady as before). A model that changes between
rounds (an update) moves every annotator alike; compare against one reference model where that matters.

`LabelDrift.observe(pred, labels, who)` adds a round and returns its alarms, then folds the round into
the history only for annotators without an alarm (a drifted round is not the new normal until someone
says so: `accept(annotator)`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ecotrain.base.errors import DataError


def _lcomb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def _upper(k1: int, n1: int, k0: int, n0: int) -> float:
    """One-sided p-value that the rate k1/n1 is above k0/n0: Fisher's exact test (the hypergeometric
    tail), exact for the small counts of a class pair, where a z-test raises false alarms."""
    if n1 == 0 or n0 == 0:
        return 1.0
    k, n = k1 + k0, n1 + n0
    total = _lcomb(n, n1)
    tail = [(_lcomb(k, x) + _lcomb(n - k, n1 - x) - total) for x in range(k1, min(k, n1) + 1)]
    top = max(tail, default=-math.inf)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in tail)) if tail else 0.0


@dataclass
class _Record:
    n: int = 0  # labels seen
    disagree: int = 0  # labels the model read as another class
    per_class: dict = field(default_factory=dict)  # c -> labels of class c
    pairs: dict = field(default_factory=dict)  # (c, d) -> labels c the model read as d

    def add(self, pred: np.ndarray, labels: np.ndarray) -> None:
        self.n += len(labels)
        self.disagree += int((pred != labels).sum())
        for c in np.unique(labels):
            m = labels == c
            self.per_class[int(c)] = self.per_class.get(int(c), 0) + int(m.sum())
            for d, k in zip(*np.unique(pred[m], return_counts=True)):
                if int(d) != int(c):
                    self.pairs[(int(c), int(d))] = self.pairs.get((int(c), int(d)), 0) + int(k)


@dataclass
class Alarm:
    annotator: str
    kind: str  # quality | convention
    p_value: float
    before: float
    now: float
    pair: tuple = ()

    def line(self) -> str:
        what = (f"labels {self.pair[0]} the model reads as {self.pair[1]}" if self.kind == "convention"
                else "labels the model disagrees with")
        return (f"label drift ({self.kind}): annotator {self.annotator}: {what} {self.before:.1%} before, "
                f"{self.now:.1%} this round (p={self.p_value:.2g}); review its labels of this round")


class LabelDrift:
    def __init__(self, alpha: float = 0.01, min_labels: int = 30):
        if not (0 < alpha < 1) or min_labels < 1:
            raise DataError(f"label drift: alpha {alpha} must be in (0, 1) and min_labels {min_labels} >= 1")
        self.alpha, self.min_labels = alpha, min_labels
        self.history: dict[str, _Record] = {}

    def observe(self, pred, labels, who) -> list[Alarm]:
        pred, labels, who = np.asarray(pred), np.asarray(labels), np.asarray(who).astype(str)
        if not (pred.shape == labels.shape == who.shape) or pred.ndim != 1:
            raise DataError(f"label drift: predictions {pred.shape}, labels {labels.shape} and annotators "
                            f"{who.shape} must be one value per example each")
        now = {}
        for a in np.unique(who):
            m = who == a
            now[str(a)] = _Record()
            now[str(a)].add(pred[m], labels[m])
        tests = []  # (annotator, kind, p, before, now, pair)
        for a, r in now.items():
            h = self.history.get(a)
            if h is None or h.n < self.min_labels or r.n < self.min_labels:
                continue
            tests.append((a, "quality", _upper(r.disagree, r.n, h.disagree, h.n), h.disagree / h.n,
                          r.disagree / r.n, ()))
            for (c, d), k in r.pairs.items():
                n1, n0 = r.per_class.get(c, 0), h.per_class.get(c, 0)
                if n1 and n0:
                    k0 = h.pairs.get((c, d), 0)
                    tests.append((a, "convention", _upper(k, n1, k0, n0), k0 / n0, k / n1, (c, d)))
        count = {k: max(1, sum(1 for t in tests if t[1] == k)) for k in ("quality", "convention")}
        alarms, flagged = [], set()
        for a, kind, p, before, after, pair in sorted(tests, key=lambda t: t[2]):
            if p <= self.alpha / 2 / count[kind] and (a, kind) not in flagged:  # one alarm of each kind per annotator: the strongest
                flagged.add((a, kind))
                alarms.append(Alarm(a, kind, p, before, after, pair))
        drifted = {al.annotator for al in alarms}
        for a, r in now.items():
            if a not in drifted:
                self._fold(a, r)
        self._pending = {a: now[a] for a in drifted}
        return alarms

    def accept(self, annotator: str) -> None:
        """The flagged round of `annotator` is right after all (a convention agreed): it joins the history."""
        r = getattr(self, "_pending", {}).pop(annotator, None)
        if r is not None:
            self._fold(annotator, r)

    def _fold(self, a: str, r: _Record) -> None:
        h = self.history.setdefault(a, _Record())
        h.n += r.n
        h.disagree += r.disagree
        for c, k in r.per_class.items():
            h.per_class[c] = h.per_class.get(c, 0) + k
        for pair, k in r.pairs.items():
            h.pairs[pair] = h.pairs.get(pair, 0) + k
