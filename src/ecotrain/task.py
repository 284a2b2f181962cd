"""What is learned: the loss (as a sum over units, normalised once by the loop) and the metrics.

Returning sums, not means, is what makes gradient accumulation exactly equal to one big batch:
the loop divides every micro-batch's sum by the unit count of the whole effective batch.
"""

from __future__ import annotations

from typing import Callable, Mapping

import torch
import torch.nn.functional as F


class ClassificationTask:
    monitor_default = "val_loss"

    def __init__(self, label_smoothing: float = 0.0):
        self.label_smoothing = label_smoothing

    def units(self, y: torch.Tensor) -> int:
        return y.shape[0]

    def loss_sum(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out.float(), y, reduction="sum", label_smoothing=self.label_smoothing)

    def metric_sums(self, out: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"accuracy": (out.argmax(-1) == y).sum()}


class UserTask:
    """A user's mean-reduced loss `fn(out, y)` and metrics `{name: fn(out, y) -> batch mean}`."""

    def __init__(self, loss_fn: Callable, metrics: Mapping[str, Callable] | None = None):
        self.loss_fn, self.metrics = loss_fn, dict(metrics or {})

    def units(self, y) -> int:
        return len(y)

    def loss_sum(self, out, y):
        return self.loss_fn(out, y) * len(y)

    def metric_sums(self, out, y):
        return {k: fn(out, y) * len(y) for k, fn in self.metrics.items()}


def normalized_loss(task, out, y, total_units: int) -> torch.Tensor:
    """The one place where a micro-batch's loss is scaled for accumulation."""
    return task.loss_sum(out, y) / total_units
