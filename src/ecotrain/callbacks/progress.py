"""Progress: epoch, step, steps/s, time left, loss and metrics.

`ProgressBar` (on a terminal): one line of text drawn through rich's `Live` (which keeps log lines
above the bar), redrawn at most twice a second. rich's `Progress` lays out a table of columns on
every redraw: ~1.9 ms here against ~0.3 ms for this line, and on a small model the redraws are a
visible share of the run (bench/overhead.py).

`ProgressLog` (no terminal: CI, nohup, a pipe, a notebook): the same figures as a plain log line
every `logging.progress_seconds` (30 s), the first one sooner (`FIRST_SECONDS`: a user sees that it
started, and its speed and time left, within seconds), through the `ecotrain` logger.
"""

from __future__ import annotations

import sys
import time

from ecotrain.callbacks.base import Callback
from ecotrain.base.log import log

BAR_WIDTH = 20  # leaves an 80-column terminal room for the loss
FIRST_SECONDS = 5.0  # ProgressLog's first line, when its interval is longer


def _duration(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}"


def latest_metrics(state) -> str:
    """The last logged loss, the last validation metrics and the ledger's display fields."""
    parts = []
    if "loss" in state.last_log:
        parts.append(f"loss {state.last_log['loss']:.4f}")
    for k, v in state.last_eval.items():
        if k.startswith("val_"):
            parts.append(f"{k} {v:.4f}")
    parts += [f"{k} {v}" for k, v in state.progress_fields.items()]
    return "  ".join(parts)


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
        self.info = latest_metrics(state)

    on_eval_end = on_log

    def on_fit_end(self, state):
        if self.live:
            self.on_log(state, None)
            self.live.update(self.line(state, time.perf_counter()), refresh=True)
            self.live.stop()
            self.live = None

    def on_exception(self, state, exc):
        self.on_fit_end(state)


class ProgressLog(Callback):
    """One plain log line every `seconds` when no terminal shows a bar: step, speed over the last
    interval, time left, the latest metrics. A clock read per step (~0.1 us) and nothing else."""

    def __init__(self, seconds: float = 30.0):
        self.seconds = seconds
        self._next = self._t = 0.0
        self._s = 0

    def on_fit_start(self, state):
        self._t, self._s = time.perf_counter(), state.step
        self._next = self._t + min(self.seconds, FIRST_SECONDS)

    def on_step_end(self, state):
        now = time.perf_counter()
        if now >= self._next:
            self._next = now + self.seconds
            log.info(self.line(state, now))

    def line(self, state, now: float) -> str:
        done, total = state.step, state.total_steps
        rate = (done - self._s) / max(now - self._t, 1e-9)  # over the last interval: a load change shows
        self._t, self._s = now, done
        where = f"step {done}/{total} ({100 * done // total}%)" if total else f"step {done}"
        text = f"epoch {state.epoch + 1} {where}  {rate:.1f} steps/s"
        if total and done < total and rate > 0:
            text += f"  {_duration((total - done) / rate)} left"
        info = latest_metrics(state)
        return f"{text}  {info}" if info else text
