"""What is learned: the loss (a mean over the batch's units: samples, or tokens) and the metrics.

`normalized_loss` weights each micro-batch's mean by its share of the effective batch's units,
which makes gradient accumulation exactly one big batch (and costs nothing without accumulation).
"""

from __future__ import annotations

import math
from typing import Callable, Mapping

import torch
import torch.nn.functional as F


class ClassificationTask:
    def __init__(self, label_smoothing: float = 0.0):
        self.label_smoothing = label_smoothing

    def units(self, y: torch.Tensor) -> int:
        return y.shape[0]

    def loss(self, out: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        out = out if out.dtype == torch.float32 else out.float()  # fp32 softmax under autocast
        return F.cross_entropy(out, y, reduction=reduction, label_smoothing=self.label_smoothing)

    def metric_sums(self, out: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"accuracy": (out.argmax(-1) == y).sum()}


class LanguageModelTask:
    """Next-token prediction: `out [b, T, vocab]`, `y [b, T]`, padded targets = -100 (skipped).

    The units are the non-padding target tokens, so the loss is a mean per token and
    `normalized_loss` stays exact under accumulation however the padding falls."""

    IGNORE = -100

    def units(self, y: torch.Tensor) -> int:
        return int((y != self.IGNORE).sum())

    def loss(self, out: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        out = out.float() if out.dtype in (torch.float16, torch.bfloat16) else out  # fp32 softmax under autocast
        return F.cross_entropy(out.flatten(0, 1), y.reshape(-1), ignore_index=self.IGNORE, reduction=reduction)

    def metric_sums(self, out: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        nats = self.loss(out, y, "sum")  # evaluation only: a second, cheap cross-entropy
        return {"accuracy": (out.argmax(-1) == y).sum(), "bits_per_char": nats / math.log(2)}


class UserTask:
    """A user's mean-reduced loss `fn(out, y)` and metrics `{name: fn(out, y) -> batch mean}`."""

    def __init__(self, loss_fn: Callable, metrics: Mapping[str, Callable] | None = None):
        self.loss_fn, self.metrics = loss_fn, dict(metrics or {})

    def units(self, y) -> int:
        return len(y)

    def loss(self, out, y, reduction: str = "mean"):
        mean = self.loss_fn(out, y)
        return mean if reduction == "mean" else mean * len(y)

    def metric_sums(self, out, y):
        return {k: fn(out, y) * len(y) for k, fn in self.metrics.items()}


def normalized_loss(task, out, y, total_units: int | None) -> torch.Tensor:
    """The one place where a micro-batch's loss is scaled for accumulation
    (`total_units` None: the micro-batch is the whole batch)."""
    loss = task.loss(out, y)
    if total_units is None:
        return loss
    n = task.units(y)
    return loss if n == total_units else loss * (n / total_units)
