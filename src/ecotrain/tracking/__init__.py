"""Trackers beside metrics.jsonl: MLflow and TensorBoard, each an optional extra, each a Callback.

Chosen in the config (`tracking: {mlflow: {...}, tensorboard: {...}}`, config/__init__.py `TrackingConfig`);
`run_callbacks(ctx)` is the tracking wing (wings.py). The trackers run on rank 0 only and
their modules (and mlflow / tensorboard) are imported only when chosen: a run without trackers
never imports them. A tracker chosen but not installed is one ConfigError line naming the extra.

A tracker sees the run through the callback hooks (params at `on_fit_start`, the records of
`on_log` / `on_eval_end`, its state in checkpoints under its `state_key`) and, once `finish` has
written summary.json, ledger.json and environment.json, through `run_finished(run_dir, summary)`:
`after_finish` (called by `finish`, rank 0) writes environment.json and then calls it.
"""

from __future__ import annotations

import importlib.util

from ecotrain.callbacks.base import Callback
from ecotrain.callbacks.wing import WingContext
from ecotrain.base.errors import ConfigError
from ecotrain.tracking.base import Tracker, flatten, numeric  # noqa: F401  (the trackers' shared parts)

EXTRAS = {  # tracker -> (module that must be importable, what it is, the extra to install)
    "mlflow": ("mlflow", "MLflow", "pip install 'ecotrain[mlflow]'"),
    "tensorboard": ("tensorboard", "TensorBoard", "pip install 'ecotrain[tensorboard]'"),
}


def require(name: str) -> None:
    """One clear line when the tracker `name` is chosen but its package is not installed."""
    module, what, install = EXTRAS[name]
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ConfigError(f"tracking.{name}: {what} is not installed ({module!r} not found); {install}, "
                          f"or remove tracking.{name} from the config")


def run_callbacks(ctx: WingContext) -> list[Callback]:
    """The tracking wing: the trackers `config.tracking` chooses (rank 0 only; none elsewhere)."""
    t = ctx.config.tracking
    if not ctx.is_main or (t.mlflow is None and t.tensorboard is None):
        return []
    out: list[Callback] = []
    if t.mlflow is not None:
        require("mlflow")
        from ecotrain.tracking.mlflow_tracker import MlflowTracker

        out.append(MlflowTracker(t.mlflow, ctx.run_dir))
    if t.tensorboard is not None:
        require("tensorboard")
        from ecotrain.tracking.tensorboard_tracker import TensorboardTracker

        out.append(TensorboardTracker(t.tensorboard, ctx.run_dir))
    return out


def after_finish(run, summary: dict) -> None:
    """Rank 0, after summary.json and ledger.json: environment.json, then each tracker's last upload."""
    from ecotrain.base.environment import write_environment

    write_environment(run.folder.path, run.bundle.content_hash, run.threads)
    for cb in run.cbs.callbacks:
        if isinstance(cb, Tracker):
            cb.run_finished(run.folder.path, summary)
