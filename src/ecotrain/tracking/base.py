"""What every tracker shares: the Tracker callback type and the flattening of params and records."""

from __future__ import annotations

import json
import math
from pathlib import Path

from ecotrain.callbacks.base import Callback


class Tracker(Callback):
    """A tracker callback: the hooks, plus `run_finished` once the run folder's results are written."""

    def run_finished(self, run_dir: Path, summary: dict) -> None: ...


def flatten(tree, prefix: str = "") -> dict:
    """{"optim": {"lr": 1e-3}} -> {"optim.lr": 1e-3}; lists and None as their JSON text."""
    out: dict = {}
    for k, v in (tree or {}).items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        elif isinstance(v, (int, float, str, bool)):
            out[key] = v
        else:
            out[key] = json.dumps(v)
    return out


def numeric(record: dict) -> dict:
    """The finite numbers of a metrics record, `step` and `epoch` excepted."""
    return {k: float(v) for k, v in record.items() if k not in ("step", "epoch") and isinstance(v, (int, float))
            and not isinstance(v, bool) and math.isfinite(v)}
