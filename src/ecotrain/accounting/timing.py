"""CarbonTiming: train when the grid is clean (`carbon.forecast`, `carbon.deadline`, `carbon.threshold`).

At a check (every step with the simulated clock, every `check_every` steps with the real one) it asks
forecast.plan whether to train now; when not, it saves a checkpoint (through the Checkpointer: the
run is safe through the wait, and a kill during it resumes from there), waits until the planned
time, and training goes on from the very step it stood at: the weights are those of a run that never
paused. A stop signal during the wait ends the run as preempted (the checkpoint is already written).

It records the intervals the run trained in, each with the forecast intensity of its slot, its steps
and, when the ledger measures energy, its kWh; the ledger takes CO2e as the sum over intervals of
kWh x intensity (ledger.json `co2e.intervals`). The intervals ride in the checkpoint (exact resume).

The clock: real (time.time(), real sleep), or `carbon.clock: {start, seconds_per_step}`, a simulated
one for tests and benches: now = start + step x seconds_per_step + the time waited, and a wait passes
at once. It runs after the Checkpointer, so what it saves is the step every other callback finished.
"""

from __future__ import annotations

import time
from typing import Optional

from ecotrain.accounting.forecast import intensity_at, iso, parse_deadline, parse_time, plan, read_forecast
from ecotrain.callbacks.base import Callback
from ecotrain.config.carbon import SimulatedClock
from ecotrain.base.log import log

_SLEEP = 1.0  # seconds between checks for a stop signal during a real wait


class CarbonTiming(Callback):
    state_key = "CarbonTiming"
    after = ("Checkpointer",)  # a pause saves the step every callback has finished

    def __init__(self, cfg, checkpointer, preemption=None, ledger=None):
        self.cfg, self.checkpointer, self.preemption, self.ledger = cfg, checkpointer, preemption, ledger
        self.slots = read_forecast(cfg.forecast)
        self.sim: Optional[SimulatedClock] = cfg.clock if isinstance(cfg.clock, SimulatedClock) else None
        self.sim_start = parse_time(self.sim.start, "carbon.clock.start") if self.sim else None
        if cfg.deadline:  # a bad deadline: one line now, before anything trains (a duration: from this start)
            parse_deadline(cfg.deadline, self.sim_start if self.sim else time.time())
        self.waited = 0.0  # simulated seconds spent waiting (the simulated clock only)
        self.first_start: Optional[float] = None  # the run's first start: a duration deadline counts from it
        self.intervals: list[dict] = []
        self.open: Optional[dict] = None
        self.pauses = 0
        self._seg = (0, 0.0)  # (step, time) this segment's running started at: the real clock's step time
        if ledger is not None:
            ledger.timing = self

    # -- the clock ----------------------------------------------------------------------------
    def now(self, state) -> float:
        if self.sim is not None:
            return self.sim_start + state.step * self.sim.seconds_per_step + self.waited
        return time.time()

    def seconds_per_step(self, state) -> Optional[float]:
        if self.sim is not None:
            return self.sim.seconds_per_step
        steps, t0 = state.step - self._seg[0], self._seg[1]
        return (time.time() - t0) / steps if steps > 0 else None

    @property
    def deadline(self) -> Optional[float]:
        return parse_deadline(self.cfg.deadline, self.first_start) if self.cfg.deadline else None

    # -- hooks --------------------------------------------------------------------------------
    def on_fit_start(self, state):
        now = self.now(state)
        if self.first_start is None:
            self.first_start = now
        self._seg = (state.step, time.time())
        if self.open is not None:  # resumed: the interval the checkpoint was taken in ends here
            self._close(state, now)
        self._open(state, now)
        self._decide(state)

    def on_step_end(self, state):
        if state.should_stop:
            return
        if self.sim is None and state.step % self.cfg.check_every:
            return
        now = self.now(state)
        if intensity_at(self.slots, now) != self.open["g_per_kwh"]:  # a new slot: a new interval
            self._close(state, now)
            self._open(state, now)
        self._decide(state)

    def _decide(self, state) -> None:
        now, per_step = self.now(state), self.seconds_per_step(state)
        if per_step is None or state.step >= state.total_steps:
            return  # no step timed yet (a real clock): decide at the next check
        need = (state.total_steps - state.step) * per_step
        until = plan(self.slots, now, need, self.deadline, self.cfg.threshold)
        if until is None or until <= now:
            return
        self.checkpointer.save(state)  # the wait is safe: a kill during it resumes from this step
        self._close(state, now)
        self.pauses += 1
        log.info(f"carbon: {intensity_at(self.slots, now):.0f} g/kWh now; pausing at step {state.step} until "
                 f"{iso(until)} ({intensity_at(self.slots, until):.0f} g/kWh)")
        if not self._wait(state, until):
            state.stop("preempted")
            return
        self._seg = (state.step, time.time())
        self._open(state, self.now(state))

    def _wait(self, state, until: float) -> bool:
        """Wait until `until`; False when a stop signal came first."""
        if self.sim is not None:
            self.waited += until - self.now(state)  # a simulated wait passes at once
            return not (self.preemption is not None and self.preemption.requested)
        while time.time() < until:
            if self.preemption is not None and self.preemption.requested:
                return False
            time.sleep(min(_SLEEP, max(until - time.time(), 0.0)))
        return True

    # -- intervals ----------------------------------------------------------------------------
    def _kwh(self, state) -> Optional[float]:
        return self.ledger.spend(state)["energy_kwh"] if self.ledger is not None else None

    def _open(self, state, now: float) -> None:
        self.open = {"start": iso(now), "g_per_kwh": intensity_at(self.slots, now), "from_step": state.step,
                     "kwh_at_start": self._kwh(state)}

    def _close(self, state, now: float) -> None:
        o, self.open = self.open, None
        if o is None:
            return
        if state.step == o["from_step"]:
            return  # nothing trained in it
        kwh, k0 = self._kwh(state), o.pop("kwh_at_start")
        self.intervals.append({**o, "end": iso(now), "to_step": state.step,
                               "kwh": kwh - k0 if kwh is not None and k0 is not None else None})

    def record(self, state, total_kwh: Optional[float]) -> dict:
        """The intervals for ledger.json, the open one closed at this step; the last interval's kWh is
        what the total says the others did not take (the meter's final figure is the total's)."""
        if self.open is not None:
            self._close(state, self.now(state))
        out = [dict(i) for i in self.intervals]
        if total_kwh is not None and out and all(i["kwh"] is not None for i in out[:-1]):
            out[-1]["kwh"] = max(total_kwh - sum(i["kwh"] for i in out[:-1]), 0.0)
        else:
            for i in out:
                i["kwh"] = None if total_kwh is None else i["kwh"]
        steps = sum(i["to_step"] - i["from_step"] for i in out)
        return {"intervals": out, "pauses": self.pauses, "forecast": str(self.cfg.forecast),
                "deadline": iso(self.deadline) if self.deadline is not None else None,
                "finished_at": iso(self.now(state)),
                "deadline_met": None if self.deadline is None else self.now(state) <= self.deadline + 1e-6,
                "g_per_kwh_by_steps": sum(i["g_per_kwh"] * (i["to_step"] - i["from_step"]) for i in out) / steps
                if steps else None,
                "clock": "simulated" if self.sim else "real"}

    # -- resume -------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"waited": self.waited, "first_start": self.first_start, "intervals": self.intervals,
                "pauses": self.pauses, "open": self.open}

    def load_state_dict(self, sd: dict) -> None:
        self.waited, self.first_start = sd["waited"], sd["first_start"]
        self.intervals, self.pauses = [dict(i) for i in sd["intervals"]], sd["pauses"]
        self.open = dict(sd["open"]) if sd.get("open") else None
