"""A rich progress bar: epoch, step, loss, metric, steps/s, ETA. Redrawn at most twice a second."""

from __future__ import annotations

import sys
import time

from ecotrain.callbacks.base import Callback


class ProgressBar(Callback):
    def __init__(self, refresh_seconds: float = 0.5, console=None):
        self.refresh_seconds = refresh_seconds
        self.console = console
        self.progress = None
        self._next = 0.0
        self._every = 16  # steps between clock reads; a clock read costs little, but not nothing

    def on_fit_start(self, state):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        console = self.console or Console(file=sys.stderr)
        self.progress = Progress(
            TextColumn("epoch {task.fields[epoch]}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"), TextColumn("{task.fields[rate]}"),
            TimeRemainingColumn(), console=console, auto_refresh=False, transient=False)
        self.progress.start()
        self.task = self.progress.add_task("train", total=state.total_steps, completed=state.step,
                                           epoch=state.epoch + 1, info="", rate="")
        self._t0, self._s0 = time.perf_counter(), state.step

    def on_step_end(self, state):
        if state.step % self._every:
            return
        now = time.perf_counter()
        if now >= self._next:
            self._next = now + self.refresh_seconds
            rate = (state.step - self._s0) / max(now - self._t0, 1e-9)
            self.progress.update(self.task, completed=state.step, epoch=state.epoch + 1, rate=f"{rate:.0f} steps/s")
            self.progress.refresh()

    def _info(self, state):
        parts = []
        if "loss" in state.last_log:
            parts.append(f"loss {state.last_log['loss']:.4f}")
        for k, v in state.last_eval.items():
            if k.startswith("val_"):
                parts.append(f"{k} {v:.4f}")
        parts += [f"{k} {v}" for k, v in state.progress_fields.items()]
        return "  ".join(parts)

    def on_log(self, state, record):
        self.progress.update(self.task, info=self._info(state))

    on_eval_end = on_log

    def on_fit_end(self, state):
        if self.progress:
            self.progress.update(self.task, completed=state.step, info=self._info(state))
            self.progress.refresh()
            self.progress.stop()
            self.progress = None

    def on_exception(self, state, exc):
        self.on_fit_end(state)
