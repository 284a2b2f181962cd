"""Stateful metrics: `update(preds, target)` per batch, `compute()` once over the whole split,
`reset()`. Exact over the split whatever the batch sizes (F1, R2 and the like are not means of
batch means), and synced across ranks: every metric here keeps its state as one vector of sums
(`sums`), which `loop.evaluate` all-reduces together with the loss in one collective.

Any object with `update/compute/reset` works in their place (a torchmetrics `Metric`, which syncs
itself under torch.distributed); a plain function `fn(preds, target) -> batch mean` is wrapped in
`BatchMean`, weighted by each batch's samples.
"""

from __future__ import annotations

import math
import weakref
from typing import Callable

import torch

IGNORE = -100  # target value skipped by token-level metrics (padding), as in cross-entropy


class SumMetric:
    """A metric whose state is a vector of sums; `value(sums)` turns the reduced sums into a number.
    `add` keeps each batch's values as they come (tensors stay on the device, no sync, no stacking per
    batch); `sums` adds them up once, at the end of the split."""

    size = 2

    def __init__(self):
        self.parts: list = []

    def add(self, *values) -> None:
        self.parts.append(values)

    @property
    def sums(self) -> torch.Tensor | None:
        if not self.parts:
            return None
        cols = zip(*self.parts)
        out = [sum(c[1:], c[0]) for c in cols]  # tensors add on their device; plain numbers as numbers
        device = next((v.device for v in out if isinstance(v, torch.Tensor)), None)
        return torch.stack([torch.as_tensor(v, device=device).double().reshape(()) for v in out])

    def reset(self) -> None:
        self.parts = []

    def compute(self) -> float:
        sums = self.sums
        return self.value(sums if sums is not None else torch.zeros(self.size, dtype=torch.float64))

    def value(self, sums: torch.Tensor) -> float:
        return float(sums[0] / sums[1]) if float(sums[1]) else float("nan")


class Accuracy(SumMetric):
    """Top-1 accuracy; tokens whose target is -100 are skipped. `multilabel`: the share of labels
    right, each on when its sigmoid is above `threshold`."""

    def __init__(self, multilabel: bool = False, threshold: float = 0.5, ignore: bool = True):
        super().__init__()
        self.multilabel, self.threshold, self.ignore = multilabel, threshold, ignore

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        if self.multilabel:
            on = torch.sigmoid(preds.float()) > self.threshold
            self.add((on == (target > 0.5)).sum(), target.numel())
            return
        if not self.ignore:  # class ids, no padding: one comparison (evaluation runs every epoch)
            self.add((preds.argmax(-1) == target).sum(), target.shape[0])
            return
        keep = target != IGNORE
        self.add(((preds.argmax(-1) == target) & keep).sum(), keep.sum())


class MeanSquaredError(SumMetric):
    def update(self, preds, target) -> None:
        d = preds.float().reshape(target.shape) - target.float()
        self.add((d * d).sum(), d.numel())


class MeanAbsoluteError(SumMetric):
    def update(self, preds, target) -> None:
        d = preds.float().reshape(target.shape) - target.float()
        self.add(d.abs().sum(), d.numel())


class R2Score(SumMetric):
    """1 - SSE / total variance of the targets, over the whole split (every output pooled)."""

    size = 4

    def update(self, preds, target) -> None:
        t = target.double()
        d = preds.double().reshape(target.shape) - t
        self.add((d * d).sum(), t.sum(), (t * t).sum(), t.numel())

    def value(self, sums) -> float:
        sse, s, ss, n = (float(v) for v in sums)
        var = ss - s * s / n if n else 0.0
        return 1.0 - sse / var if var > 0 else float("nan")


class F1Score(SumMetric):
    """Macro F1 over `num_classes` classes, from the split's confusion counts."""

    def __init__(self, num_classes: int):
        super().__init__()
        self.size = num_classes * 3  # tp, fp, fn per class
        self.classes = num_classes

    def update(self, preds, target) -> None:
        keep = target != IGNORE
        p, t = preds.argmax(-1)[keep], target[keep]
        c = self.classes
        tp = torch.bincount(t[p == t], minlength=c)
        fp = torch.bincount(p[p != t], minlength=c)
        fn = torch.bincount(t[p != t], minlength=c)
        self.add(torch.cat([tp, fp, fn]).double())

    @property
    def sums(self) -> torch.Tensor | None:
        return torch.stack([p[0] for p in self.parts]).sum(0) if self.parts else None

    def value(self, sums) -> float:
        tp, fp, fn = sums.view(3, -1)
        seen = (tp + fp + fn) > 0
        f1 = 2 * tp / (2 * tp + fp + fn).clamp(min=1)
        return float(f1[seen].mean()) if bool(seen.any()) else float("nan")


class SumOver(SumMetric):
    """A sum divided by a count, both given per batch (bits per character: nats / ln 2 per token)."""

    def __init__(self, fn: Callable):
        super().__init__()
        self.fn = fn

    def update(self, preds, target) -> None:
        self.add(*self.fn(preds, target))


class TokenLoss:
    """`fn(preds, target) -> (loss sum, tokens)` computed once per batch for every figure that reads
    it (perplexity, bits per byte...): `loop.evaluate` updates each metric with the same two tensors,
    so one cross-entropy serves them all. Held by weak reference: no batch's logits outlive it."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self._seen: tuple = (None, None)
        self._sums = None

    def __call__(self, preds, target):
        p, t = self._seen
        if p is None or p() is not preds or t() is not target:
            self._sums = self.fn(preds, target)
            self._seen = (weakref.ref(preds), weakref.ref(target))
        return self._sums


class MeanTokenLoss(SumMetric):
    """A figure of the split's mean loss per token, `of(loss sum / tokens)`, its sums from a shared
    `TokenLoss`: perplexity (of bits: 2 ** b), bits per byte (b / bytes per token)."""

    def __init__(self, loss: TokenLoss, of: Callable[[float], float]):
        super().__init__()
        self.loss, self.of = loss, of

    def update(self, preds, target) -> None:
        self.add(*self.loss(preds, target))

    def value(self, sums) -> float:
        return self.of(float(sums[0] / sums[1])) if float(sums[1]) else float("nan")


def perplexity_of_bits(bits: float) -> float:
    """exp of the mean token loss in nats, from bits per token; inf past a float's range (a diverged run)."""
    return 2.0 ** bits if bits < 1000 else math.inf


class BatchMean(SumMetric):
    """A plain function `fn(preds, target) -> mean over the batch`, weighted by the batch's samples."""

    def __init__(self, fn: Callable):
        super().__init__()
        self.fn = fn

    def update(self, preds, target) -> None:
        n = len(target) if hasattr(target, "__len__") else 1
        self.add(torch.as_tensor(self.fn(preds, target)).detach().float() * n, n)


def as_metric(obj):
    """An object with update/compute/reset as it is; a function wrapped in `BatchMean`."""
    if all(callable(getattr(obj, a, None)) for a in ("update", "compute", "reset")):
        return obj
    if callable(obj):
        return BatchMean(obj)
    raise TypeError(f"a metric must have update/compute/reset or be a function (preds, target), "
                    f"got {type(obj).__name__}")


def scalar(value) -> float:
    """A metric's computed value as a float (a 0-d tensor from torchmetrics included)."""
    if isinstance(value, torch.Tensor):
        return float(value.detach().float().mean()) if value.numel() != 1 else float(value.item())
    return float(value)
