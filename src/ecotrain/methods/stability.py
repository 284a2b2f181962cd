"""Early stopping on validation stability: stop once the monitored metric has stopped moving.

    methods:
      - name: stability_stop
        monitor: val_loss   # any key of the evaluation record
        window: 5           # the last 5 evaluations
        tolerance: 0.005    # stable: (max - min) over them <= 0.005 x |their mean|
        min_steps: 0        # never before this step

The patience-based `early_stopping` waits for the metric to stop *improving*; this one stops when
it stops *changing*, which also ends a run whose metric drifts within noise while improving by
tiny amounts (what a long cosine tail does). It asks to stop through `state.stop("stable:<monitor>")`
and the run finishes as usual (best weights, test). The window of recent values is its checkpointed
state, so a resume decides at the same step.

When it helps: long fixed schedules that plateau early; the tail's FLOPs are saved. Risks: a
tolerance too wide stops on a temporary plateau (before a schedule's LR drop); evaluate often
enough (loop.eval_every) that `window` evaluations span a real plateau. Cost: none.
"""

from __future__ import annotations

from ecotrain.methods.base import Method


def is_stable(values: list[float], tolerance: float) -> bool:
    mean = sum(values) / len(values)
    return max(values) - min(values) <= tolerance * abs(mean)


class StabilityStop(Method):
    def __init__(self, cfg, run=None, trained=None):
        self.key, self.monitor, self.window = "stability_stop", cfg.monitor, cfg.window
        self.tolerance, self.min_steps = cfg.tolerance, cfg.min_steps
        self.values: list[float] = []
        self.stopped_at = None

    def on_eval_end(self, state, record):
        if self.monitor not in record:
            return
        self.values = (self.values + [float(record[self.monitor])])[-self.window:]
        if (len(self.values) == self.window and state.step >= self.min_steps
                and is_stable(self.values, self.tolerance)):
            self.stopped_at = state.step
            state.stop(f"stable:{self.monitor}")

    def summary(self) -> dict:
        return {"monitor": self.monitor, "window": self.window, "tolerance": self.tolerance,
                "stopped_at_step": self.stopped_at}

    def state_dict(self) -> dict:
        return {"values": list(self.values), "stopped_at": self.stopped_at}

    def load_state_dict(self, sd: dict) -> None:
        self.values, self.stopped_at = list(sd["values"]), sd["stopped_at"]
