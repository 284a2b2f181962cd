"""A progress bar: epoch, step, steps/s, time left, loss and metrics. Redrawn at most twice a second.

One line of text drawn through rich's `Live` (which keeps log lines above the bar). rich's
`Progress` lays out a table of columns on every redraw: ~1.9 ms here against ~0.3 ms for this
line, and on a small model the redraws are a visible share of the run (bench/overhead.py).
"""

from __future__ import annotations

import sys
import time

from ecotrain.callbacks.base import Callback

BAR_WIDTH = 20  # leaves an 80-column terminal room for the loss


def _duration(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}"


class ProgressBar(Callback):
    def __init__(self, refresh_seconds: float = 0.5, console=None):
        self.refresh_seconds = refresh_seconds
        self.console = console
        self.live = None
        self.info = ""
        self._next = 0.0
        self._every = 16  # steps between clock reads; a clock read costs little, but not nothing

    def on_fit_start(self, state):
        from rich.console import Console
        from rich.live import Live

        console = self.console or Console(file=sys.stderr)
        self._t0, self._s0 = time.perf_counter(), state.step
        self.live = Live(self.line(state, self._t0), console=console, auto_refresh=False, transient=False)
        self.live.start()

    def line(self, state, now: float):
        """The bar as one line of rich Text."""
        from rich.text import Text

        done, total = state.step, state.total_steps
        rate = (done - self._s0) / max(now - self._t0, 1e-9)
        text = Text(f"epoch {state.epoch + 1} ", no_wrap=True, overflow="ellipsis")  # one line, cut at the edge
        if total:
            filled = min(BAR_WIDTH, BAR_WIDTH * done // total)
            text.append("━" * filled, style="bar.complete" if done < total else "bar.finished")
            text.append("━" * (BAR_WIDTH - filled), style="bar.back")
            text.append(f" {done}/{total}")
        else:
            text.append(f"step {done}")
        if done > self._s0:
            text.append(f"  {rate:.0f} steps/s", style="progress.data.speed")
            if total and done < total:
                text.append(f"  {_duration((total - done) / rate)}", style="progress.remaining")
        if self.info:  # last: a narrow terminal cuts the metrics, not the speed and the time left
            text.append(f"  {self.info}")
        return text

    def on_step_end(self, state):
        if state.step % self._every:
            return
        now = time.perf_counter()
        if now >= self._next:
            self._next = now + self.refresh_seconds
            self.live.update(self.line(state, now), refresh=True)

    def on_log(self, state, record):
        parts = []
        if "loss" in state.last_log:
            parts.append(f"loss {state.last_log['loss']:.4f}")
        for k, v in state.last_eval.items():
            if k.startswith("val_"):
                parts.append(f"{k} {v:.4f}")
        parts += [f"{k} {v}" for k, v in state.progress_fields.items()]
        self.info = "  ".join(parts)

    on_eval_end = on_log

    def on_fit_end(self, state):
        if self.live:
            self.on_log(state, None)
            self.live.update(self.line(state, time.perf_counter()), refresh=True)
            self.live.stop()
            self.live = None

    def on_exception(self, state, exc):
        self.on_fit_end(state)
