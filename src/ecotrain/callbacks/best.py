"""The best validation result (always tracked: the test runs on the best weights) and early stopping."""

from __future__ import annotations

import math

from ecotrain.callbacks.base import Callback
from ecotrain.base.tensorfile import cpu_copy


class BestTracker(Callback):
    def __init__(self, monitor: str, mode: str, min_delta: float = 0.0):
        self.monitor, self.mode, self.min_delta = monitor, mode, min_delta

    def improved(self, value: float, best: float | None) -> bool:
        if best is None:
            return math.isfinite(value)
        return value < best - self.min_delta if self.mode == "min" else value > best + self.min_delta

    def on_eval_end(self, state, record):
        if self.monitor not in record:
            return
        value = record[self.monitor]
        if self.improved(value, state.best_metric):
            state.best_metric, state.best_step, state.evals_since_best = value, state.step, 0
            state.best_weights = cpu_copy(state.eval_model().state_dict())
        else:
            state.evals_since_best += 1


class EarlyStopping(Callback):
    """Stops after `patience` evaluations without improvement of BestTracker's monitor."""

    after = ("BestTracker",)  # it reads evals_since_best, which BestTracker keeps

    def __init__(self, patience: int):
        self.patience = patience

    def on_eval_end(self, state, record):
        if state.evals_since_best >= self.patience:
            state.stop("early_stopping")
