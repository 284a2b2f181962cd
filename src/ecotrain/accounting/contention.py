"""Noticing a busy machine: steps much slower than this run's fastest while more tasks want the CPUs
than there are.

Measured figures (wall time, CPU-seconds, energy, CO2e, money) move with the machine's load: on a
loaded 2-core machine the demo CNN ran ~19x slower with two threads. `ContentionWatch` samples the
machine at most every `CHECK_SECONDS` (one clock read per step; the 1-minute load average and
/proc/pressure/cpu, two small reads, per sample), logs ONE warning when steps are `SLOWDOWN` times
slower than the run's fastest interval while the load exceeds the machine's CPUs, and hands the
ledger its `record()`: ledger.json `contention`, which `ecotrain compare` reads to call a measured
verdict unreliable.

    seen        the warning fired, or the machine was over-loaded in at least half the samples
    load        the highest 1-minute load average seen while over-loaded (else the highest seen)
    pressure    the highest /proc/pressure/cpu `some avg10` seen (%), where the kernel has it
    slowdown    the slowest interval's seconds per step over the fastest's
    cpus        the machine's CPUs the load is compared with
    samples, contended_samples
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, Optional

from ecotrain.callbacks.base import Callback
from ecotrain.base.log import log

CHECK_SECONDS = 5.0  # between samples: the load average itself moves on a 5 s tick
SLOWDOWN = 2.0  # an interval this many times slower than the fastest one, while over-loaded: warn
PRESSURE_BUSY = 60.0  # /proc/pressure/cpu some avg10 (%): tasks waited for a CPU most of the last 10 s


def cpu_pressure(path: str = "/proc/pressure/cpu") -> Optional[float]:
    """`some avg10` of the kernel's CPU pressure (Linux >= 4.20 with PSI), in %; None where absent."""
    try:
        first = Path(path).read_text().splitlines()[0].split()
        return float(dict(f.split("=", 1) for f in first[1:])["avg10"])
    except (OSError, ValueError, KeyError, IndexError):
        return None


def machine_load() -> tuple[float, Optional[float]]:
    """(the 1-minute load average, CPU pressure or None)."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = 0.0
    return load, cpu_pressure()


class ContentionWatch(Callback):
    def __init__(self, cpus: Optional[int] = None, every: float = CHECK_SECONDS,
                 sample: Callable[[], tuple[float, Optional[float]]] = machine_load):
        self.cpus = cpus or os.cpu_count() or 1  # the load average counts the whole machine's tasks
        self.every, self.sample = every, sample
        self.samples = self.contended = 0
        self.load = self.worst_load = 0.0
        self.pressure: Optional[float] = None
        self.fastest: Optional[float] = None  # seconds per step
        self.slowdown = 1.0
        self.warned = False
        self._t, self._s, self._next = 0.0, 0, 0.0

    def on_fit_start(self, state):
        self._t, self._s = time.perf_counter(), state.step
        self._next = self._t + self.every

    def on_eval_end(self, state, record):  # an evaluation is not a slow step: start the interval afresh
        self._t, self._s = time.perf_counter(), state.step

    def on_step_end(self, state):
        now = time.perf_counter()
        if now < self._next or state.step <= self._s:
            return
        self._next = now + self.every
        per_step = (now - self._t) / (state.step - self._s)
        self._t, self._s = now, state.step
        self.check(per_step, *self.sample())

    def check(self, per_step: float, load: float, pressure: Optional[float]) -> None:
        """One sample: an interval's seconds per step and the machine's load then."""
        self.fastest = per_step if self.fastest is None else min(self.fastest, per_step)
        slow = per_step / self.fastest if self.fastest > 0 else 1.0
        self.samples += 1
        self.load = max(self.load, load)
        if pressure is not None:
            self.pressure = max(self.pressure or 0.0, pressure)
        busy = load > self.cpus or (pressure is not None and pressure >= PRESSURE_BUSY)
        if not busy:
            return
        self.contended += 1
        self.worst_load = max(self.worst_load, load)
        self.slowdown = max(self.slowdown, slow)
        if slow >= SLOWDOWN and not self.warned:
            self.warned = True
            why = f"load {load:.1f} on {self.cpus} CPUs" + (f", CPU pressure {pressure:.0f}%" if pressure else "")
            log.warning(f"the machine is busy: steps are {slow:.1f}x slower than this run's fastest ({why}); "
                        f"training takes about that much longer, and its time, CPU-seconds and energy are marked "
                        f"in ledger.json as measured under contention")

    def record(self) -> dict:
        seen = self.warned or (self.samples > 0 and 2 * self.contended >= self.samples)
        return {"seen": seen, "load": round(self.worst_load if self.contended else self.load, 2),
                "pressure": self.pressure, "slowdown": round(self.slowdown, 2), "cpus": self.cpus,
                "samples": self.samples, "contended_samples": self.contended}


def merge(earlier: Optional[dict], now: Optional[dict]) -> Optional[dict]:
    """Two segments of a resumed run as one record: contended if either was."""
    if not earlier or not now:
        return now or earlier
    pressures = [p for p in (earlier.get("pressure"), now.get("pressure")) if p is not None]
    return {"seen": bool(earlier.get("seen") or now.get("seen")), "load": max(earlier["load"], now["load"]),
            "pressure": max(pressures) if pressures else None,
            "slowdown": max(earlier["slowdown"], now["slowdown"]), "cpus": now["cpus"],
            "samples": earlier["samples"] + now["samples"],
            "contended_samples": earlier["contended_samples"] + now["contended_samples"]}
