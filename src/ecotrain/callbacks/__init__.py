"""Callbacks: small objects with a dozen hooks, each receiving the one TrainState."""

from ecotrain.callbacks.base import HOOKS, Callback, CallbackList
from ecotrain.callbacks.best import BestTracker, EarlyStopping
from ecotrain.callbacks.checkpointing import Checkpointer
from ecotrain.callbacks.divergence import DivergenceGuard
from ecotrain.callbacks.metrics_log import MetricsLogger
from ecotrain.callbacks.progress import ProgressBar, ProgressLog

__all__ = ["HOOKS", "Callback", "CallbackList", "BestTracker", "EarlyStopping", "Checkpointer", "DivergenceGuard",
           "MetricsLogger", "ProgressBar", "ProgressLog"]
