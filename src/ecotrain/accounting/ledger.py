"""The Ledger callback: what a run cost, in FLOPs, hours, energy, CO2e and money, and its budgets.

Per step it does integer and float bookkeeping only (two comparisons; a clock read every 8 steps when
a time or money budget is set). FLOPs are counted once, on the first step of the run, and
accounted per sample actually trained and evaluated afterwards. CodeCarbon is built in the
background when the callbacks are (its start-up overlaps the set-up, and never counts), started in
`on_fit_start` just before the ledger's own clocks, and stopped in `on_fit_end`; its totals are
read at log intervals.
It runs before MetricsLogger and ProgressBar: each log record gains `energy_kwh`, `co2e_g` and
`flops`, and `state.progress_fields` the bar's kWh and gCO2e.

The ledger covers training: the loop's steps and periodic evaluations, summed over resumed segments
(the steps a preempted run redoes after its last checkpoint are not counted twice; the final test
pass that `fit` runs after the loop is outside it). The trainer writes it as ledger.json.

`contention` in ledger.json is the ContentionWatch's record (accounting/contention.py): whether the
measured figures were taken on an over-loaded machine, which `compare` reports as unreliable.
"""

from __future__ import annotations

import math
import os
import socket
import time
from pathlib import Path
from typing import Optional

import torch

from ecotrain.accounting import budget as budget_mod
from ecotrain.accounting.contention import ContentionWatch, merge as merge_contention
from ecotrain.accounting.energy import EnergyMeter, GridDataMissing, co2e_intensity, combine_ranks, nvml_gpu_ids
from ecotrain.core.flops import StepFlopCounter, StepFlops, warm_up
from ecotrain.accounting.peaks import matmul_precision, mfu
from ecotrain.accounting.prices import device_units, price_for
from ecotrain.accounting.report import write_ledger
from ecotrain.accounting.tokens import interval_rate, tokens_section
from ecotrain.callbacks.base import Callback
from ecotrain.core.device import current_index
from ecotrain.base.errors import ConfigError
from ecotrain.base.log import log

SCHEMA = 1
_CLOCK_EVERY = 8  # steps between clock reads for time and money budgets
EARLIER = "an earlier segment: "  # energy.missing_reason of a resumed run whose earlier segment had no figure
FLOPS_METHOD = ("torch.utils.flop_counter.FlopCounterMode on step {step} (forward + backward; matmul, conv and "
                "attention ops), accounted per sample trained; evaluation: that step's forward per sample")


def cpu_seconds() -> float:
    t = os.times()  # children_* count child processes that have been waited for
    return t.user + t.system + t.children_user + t.children_system


class Ledger(Callback):
    keeps_state_on_rollback = True  # the cost is what the run really spent, rolled back or not
    after = ("ContentionWatch",)
    before = ("MetricsLogger", "ProgressBar", "ProgressLog")  # it adds cost fields to their records

    def __init__(self, cfg, budget, eval_samples: int = 0, contention: Optional[ContentionWatch] = None,
                 write_to: Optional[Path] = None, tokens_per_sample: Optional[float] = None):
        self.cfg, self.eval_samples, self.contention = cfg, eval_samples, contention
        self.tokens_per_sample = tokens_per_sample  # a language model's data: ledger.json `tokens`, log `tokens`
        self._log_tokens = (0.0, 0.0)  # (tokens, clock) at the last log: tokens per second over the interval
        self.write_to = write_to  # the run folder, where ledger.json goes (rank 0's ledger only)
        self.limits = {k: v for k, v in budget.model_dump().items() if v is not None}
        self.prior = {"wall_seconds": 0.0, "cpu_seconds": 0.0, "energy_kwh": 0.0, "energy_missing": None,
                      "segments": 0, "train_flops": 0.0, "eval_flops": 0.0, "extra_flops": {},
                      "contention": None}  # earlier segments of a resumed run (state_dict)
        self.eval_passes = 0
        self.step_flops: Optional[StepFlops] = None
        self.measured_step: Optional[int] = None
        # the rate an earlier segment measured: a resume that trains no step (a finished run restarted by
        # its job) measures none, and its ledger lost the run's FLOPs (null) without it
        self.prior_step: Optional[tuple[StepFlops, int]] = None
        self.forecast: Optional[dict] = None
        self.result: Optional[dict] = None
        self.meter: Optional[EnergyMeter] = None
        self._counter = StepFlopCounter()
        self._measure = False
        self._raw: Optional[tuple[int, int]] = None
        self._samples_before = 0
        self._sample_limit = math.inf  # max_flops as a samples_seen threshold: one comparison per step
        self._next_clock = math.inf
        self._t0 = self._c0 = 0.0
        self.world = 1
        # A method that changes the per-sample work (structured pruning, progressive resizing, a batch
        # ramp) calls state.flops_changed(): the FLOPs so far are banked at the old measured rate and
        # the next step is measured again. `_piece0`/`_passes0`: where the current rate started.
        self.banked = {"train": 0.0, "eval": 0.0}
        self._piece0 = 0
        self._passes0 = 0
        self.remeasures = 0
        self._state = None  # for state_dict(), which gets no state
        self._dirty = False  # a method said the per-sample work changed: bank, then measure the next step
        self._extra: dict[str, float] = {}  # this segment's one-off FLOPs by label (add_flops)
        self.threads_pick: Optional[dict] = None  # threadpick.ThreadPick's decision: ledger.json `threads`
        self.timing = None  # accounting.timing.CarbonTiming when carbon.forecast is set: CO2e per interval

    # -- set-up --------------------------------------------------------------------------------
    def on_fit_start(self, state):
        cfg = self.cfg
        self.world = getattr(getattr(state, "dist", None), "world_size", 1)  # torchrun: per-rank figures x ranks
        if self.world > 1 and set(self.limits) - {"max_flops"}:
            raise ConfigError(f"budget.{sorted(set(self.limits) - {'max_flops'})[0]}: under torchrun only "
                              "budget.max_flops is supported (ranks would stop at different steps)")
        try:
            self.g_per_kwh, self.grid, self.intensity_source = co2e_intensity(cfg.country, cfg.carbon_intensity)
        except GridDataMissing as exc:  # no CodeCarbon data: train anyway, CO2e says why it is missing
            self.g_per_kwh, self.grid, self.intensity_source = None, cfg.country, str(exc)
        self.device_name, self.device_count = device_units(state.device)
        self.price, self.price_source = price_for(self.device_name, cfg.prices)
        warm_up()
        if cfg.energy == "codecarbon" and self.meter is None:
            self.prepare_meter(state.device)
        self._state = state
        # a resumed run counts at the rate its last segment measured: measuring its first step again would
        # run that step, unlike the uninterrupted run's, under the counter's module hooks, whose autograd
        # ordering changes the gradients' rounding (a Llama's), and the resume would no longer be exact
        self._measure = self.prior_step is None
        if self.prior_step is not None:
            self.step_flops, self.measured_step = self.prior_step
        self._piece0, self._passes0 = state.samples_seen, self.eval_passes
        if any(k in self.limits for k in budget_mod.CLOCK_BUDGETS):
            self._next_clock = state.step + _CLOCK_EVERY
        if self.meter is not None:  # waits for CodeCarbon's start-up: outside the figures below (energy.py)
            self.meter.start()
        self._t0, self._c0 = time.perf_counter(), cpu_seconds()
        self._log_tokens = (self._tokens(state), self._t0)

    def prepare_meter(self, device) -> None:
        """Build CodeCarbon's tracker in the background now (the run's set-up goes on meanwhile); the
        tracker starts, after its start-up, in on_fit_start, where the ledger's clocks start too."""
        if self.cfg.energy != "codecarbon" or self.meter is not None:
            return
        gpu_ids = nvml_gpu_ids(device, os.environ.get("CUDA_VISIBLE_DEVICES"), current_index(device))
        self.meter = EnergyMeter(self.cfg.pue, self.cfg.tracking_mode, self.cfg.sample_seconds, gpu_ids)
        self.meter.prepare()

    # -- what methods tell it (state.flops_changed / state.add_flops: TrainState.cost_listeners) --
    def flops_changed(self) -> None:
        self._dirty = True

    def add_flops(self, n: float, label: str) -> None:
        self._extra[label] = self._extra.get(label, 0.0) + float(n)

    # -- per step: integer and float bookkeeping only ------------------------------------------
    def on_step_start(self, state):
        if self._dirty:
            self._bank(state)
        if self._measure:
            self._measure, self._samples_before = False, state.samples_seen
            self._counter.start(state.model)

    def on_after_backward(self, state):
        if self._counter.active:
            self._raw = self._counter.stop()

    def on_step_end(self, state):
        if self._raw is not None:
            self._measured(state)
        if state.samples_seen > self._sample_limit:
            state.stop("budget:max_flops")
        if state.step >= self._next_clock:
            self._next_clock = state.step + _CLOCK_EVERY
            self._check(state, budget_mod.CLOCK_BUDGETS, energy=False)

    def _measured(self, state) -> None:
        (total, forward), self._raw = self._raw, None
        self.step_flops = StepFlops(total, forward, state.samples_seen - self._samples_before)
        self.measured_step = state.step
        self._flops_limit()

    def _bank(self, state) -> None:
        """Close the current FLOPs rate at this step and measure the next step again."""
        self._dirty = False
        f = self.step_flops
        if f is not None:
            self.banked["train"] += f.per_sample * (state.samples_seen - self._piece0) * self.world
            self.banked["eval"] += f.forward_per_sample * self.eval_samples * (self.eval_passes - self._passes0)
            self.remeasures += 1
        self._piece0, self._passes0 = state.samples_seen, self.eval_passes
        self._measure = True

    def _flops_limit(self) -> None:
        f = self.step_flops
        if "max_flops" in self.limits and f is not None and f.total > 0:
            left = (self.limits["max_flops"] - self.eval_flops() - self.prior["train_flops"] - self.banked["train"]
                    - self.extra_flops())
            affordable = self._piece0 + left / (f.per_sample * self.world)  # as a samples_seen value
            self._sample_limit = affordable - f.samples + 1e-6 * f.samples  # stop before a step that overdraws

    # -- at log intervals, evaluations, epoch ends -----------------------------------------------
    def on_log(self, state, record):
        if self._raw is not None:  # a segment's first step, logged before this callback's on_step_end
            self._measured(state)
        spend = self.spend(state)
        record["flops"] = spend["flops"]
        if self.tokens_per_sample:
            now, (then, t_then) = time.perf_counter(), self._log_tokens
            record["tokens"] = self._tokens(state)
            rate = interval_rate(record["tokens"], then, now - t_then)
            self._log_tokens = (record["tokens"], now)
            if rate is not None:
                record["tokens_per_second"] = rate
                state.progress_fields["tok/s"] = f"{rate:,.0f}"
        if spend["energy_kwh"] is not None:
            record["energy_kwh"] = spend["energy_kwh"]
            fields = {"kWh": f"{spend['energy_kwh']:.2g}"}
            if spend["co2e_kg"] is not None:
                record["co2e_g"] = spend["co2e_kg"] * 1000
                fields["gCO2e"] = f"{spend['co2e_kg'] * 1000:.2g}"
            state.progress_fields.update(fields)
        self._stop_if_spent(state, spend, budget_mod.ENERGY_BUDGETS)

    def on_eval_end(self, state, record):
        self.eval_passes += 1
        self._flops_limit()

    def on_epoch_end(self, state):
        spend = self.spend(state)
        if self.forecast is None and 0 < state.step < state.total_steps:
            self.forecast = budget_mod.forecast(spend, state.step, state.total_steps, self.limits)
            for line in budget_mod.warning_lines(self.forecast):
                log.warning(line)
        self._stop_if_spent(state, spend, budget_mod.SPEND_OF)

    def _check(self, state, names, energy: bool) -> None:
        self._stop_if_spent(state, self.spend(state, energy), names)

    def _stop_if_spent(self, state, spend, names) -> None:
        name = budget_mod.spent(spend, self.limits, names)
        if name:
            state.stop(f"budget:{name}")

    # -- the figures ---------------------------------------------------------------------------
    def _tokens(self, state) -> float:
        return state.samples_seen * self.world * (self.tokens_per_sample or 0.0)

    def _rate(self) -> tuple[Optional[StepFlops], Optional[int]]:
        """The measured step (and its number) the figures are counted at: this segment's, else the last one's."""
        return (self.step_flops, self.measured_step) if self.step_flops else (self.prior_step or (None, None))

    def eval_flops(self) -> float:
        f = self._rate()[0]
        live = f.forward_per_sample * self.eval_samples * (self.eval_passes - self._passes0) if f else 0.0
        return self.prior["eval_flops"] + self.banked["eval"] + live

    def train_flops(self, state) -> float:
        f = self.step_flops  # per sample of this segment: a resume may change the world size
        this = f.per_sample * (state.samples_seen - self._piece0) * self.world if f else 0.0
        return self.prior["train_flops"] + self.banked["train"] + this

    def extra_flops(self) -> float:
        """One-off costs outside the measured steps (state.add_flops), earlier segments included."""
        return sum(self.prior["extra_flops"].values()) + sum(self._extra.values())

    def extra_by_label(self) -> dict:
        out = dict(self.prior["extra_flops"])
        for k, v in self._extra.items():
            out[k] = out.get(k, 0.0) + v
        return out

    def _kwh(self) -> Optional[float]:
        if self.meter is None or self.prior["energy_missing"]:
            return None
        live = self.meter.live_kwh()
        return None if live is None else self.prior["energy_kwh"] + live

    def spend(self, state, energy: bool = True) -> dict:
        wall = self.prior["wall_seconds"] + time.perf_counter() - self._t0
        cpu = self.prior["cpu_seconds"] + cpu_seconds() - self._c0
        kwh = self._kwh() if energy else None
        return {"flops": self.train_flops(state) + self.eval_flops() + self.extra_flops() if self._rate()[0] else None,
                "wall_seconds": wall, "cpu_seconds": cpu, "cpu_hours": cpu / 3600, "energy_kwh": kwh,
                "co2e_kg": kwh * self.g_per_kwh / 1000 if kwh is not None and self.g_per_kwh is not None else None,
                "cost": wall / 3600 * self.device_count * self.world * self.price if self.price is not None else None}

    # -- the end -------------------------------------------------------------------------------
    def on_fit_end(self, state):
        spend = self.spend(state, energy=False)
        gpu_ids = getattr(self.meter, "gpu_ids", None)
        energy = self.meter.stop() if self.meter else _no_energy(self.cfg.energy)
        self.meter = None
        if self.world > 1:  # every rank metered its own process and GPU: one figure for the job
            mine = {**energy, "host": socket.gethostname(), "gpu_ids": gpu_ids}
            energy = combine_ranks(state.dist.gather_objects(mine), self.cfg.tracking_mode)
            energy.pop("host", None), energy.pop("gpu_ids", None)
        if self.prior["energy_missing"]:  # said once, however many segments it is carried through
            reason = self.prior["energy_missing"].removeprefix(EARLIER)
            energy.update(kwh=None, missing_reason=EARLIER + reason)
        elif energy["kwh"] is not None:
            energy["kwh"] += self.prior["energy_kwh"]
        self.result = self._build(state, spend, energy)  # the trainer writes it as ledger.json

    def on_finished(self, state, memory: dict) -> None:
        """ledger.json, with `memory`: every rank's peaks (a preempted run: this process's alone)."""
        if self.write_to is not None and self.result is not None:
            write_ledger(self.write_to, {**self.result, "memory": memory})

    def on_exception(self, state, exc):
        if self._counter.active:
            self._counter.stop()
        if self.meter is not None:
            self.meter.stop()  # joins CodeCarbon's threads and gives its logger back
            self.meter = None

    def contention_record(self) -> Optional[dict]:
        return merge_contention(self.prior["contention"], self.contention.record() if self.contention else None)

    def _build(self, state, spend: dict, energy: dict) -> dict:
        hours = spend["wall_seconds"] / 3600 * self.device_count * self.world
        f, measured_step = self._rate()
        flops = None if f is None else {
            "total": spend["flops"], "train": self.train_flops(state), "eval": self.eval_flops(),
            "extra": self.extra_by_label(), "remeasured": self.remeasures,
            "measured_step_flops": f.total, "measured_step_samples": f.samples,
            "per_train_sample": f.per_sample, "forward_per_sample": f.forward_per_sample,
            "eval_passes": self.eval_passes, "eval_samples_per_pass": self.eval_samples,
            "method": FLOPS_METHOD.format(step=measured_step)}
        kwh, g = energy["kwh"], self.g_per_kwh
        co2e = {"kg": kwh * g / 1000 if kwh is not None and g is not None else None, "g_per_kwh": g,
                "grid": self.grid, "source": self.intensity_source, "method": "energy kWh x grid intensity",
                "missing_reason": None if g is not None and kwh is not None else
                (self.intensity_source if g is None else "no energy figure (see energy.missing_reason)")}
        if self.timing is not None:
            co2e.update(timed_co2e(self.timing.record(state, kwh), kwh))
        cost = {"amount": hours * self.price if self.price is not None else None, "currency": self.cfg.currency,
                "price_per_device_hour": self.price, "source": self.price_source,
                "missing_reason": None if self.price is not None else
                f"no price for device '{self.device_name}': set ledger.prices"}
        stopped = state.stopped_because or ""
        devices = self.world * (self.device_count if self.device_name != "cpu" else 1)  # a CPU's peak is the process's
        precision = matmul_precision(state.config.precision, torch.backends.cuda.matmul.allow_tf32)
        lm = {} if not self.tokens_per_sample else {  # a language model's data: its cost per token
            "tokens": tokens_section(state.samples_seen * self.world, self.tokens_per_sample, f, kwh, co2e["kg"],
                                     cost["amount"], self.cfg.currency)}
        return {
            **lm, "mfu": mfu(spend["flops"], spend["wall_seconds"], devices, self.device_name, precision,
                             self.cfg.peak_flops),
            "schema": SCHEMA, "name": state.config.name, "steps": state.step, "epochs": state.epoch,
            "samples": state.samples_seen, "stopped_because": state.stopped_because,
            "segments": self.prior["segments"] + 1,
            "wall_seconds": spend["wall_seconds"], "cpu_seconds": spend["cpu_seconds"],
            "cpu_hours": spend["cpu_hours"],
            "device": {"name": self.device_name, "count": self.device_count * self.world,
                       "unit": "vCPU (torch threads)" if self.device_name == "cpu" else "device"},
            "device_hours": {self.device_name: hours},
            "flops": flops, "energy": energy, "co2e": co2e, "cost": cost,
            "budget": {"limits": self.limits,
                       "stopped_by": stopped.removeprefix("budget:") if stopped.startswith("budget:") else None},
            "forecast": self.forecast, "contention": self.contention_record(),
            **({"threads": self.threads_pick} if self.threads_pick else {}),
        }

    # -- resume --------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        if self.result is not None:
            r = self.result
            kwh, missing = r["energy"]["kwh"], r["energy"]["missing_reason"]
            wall, cpu, segments = r["wall_seconds"], r["cpu_seconds"], r["segments"]
            train = r["flops"]["train"] if r["flops"] else self.prior["train_flops"]
            evalf = r["flops"]["eval"] if r["flops"] else self.prior["eval_flops"]
        else:  # a checkpoint mid-run: this segment so far
            wall = self.prior["wall_seconds"] + time.perf_counter() - self._t0
            cpu = self.prior["cpu_seconds"] + cpu_seconds() - self._c0
            kwh, segments = self._kwh(), self.prior["segments"] + 1
            train = self.train_flops(self._state) if self._state is not None else self.prior["train_flops"]
            evalf = self.eval_flops()
            missing = self.prior["energy_missing"] or (
                (self.meter.reason if self.meter else "ledger.energy=off") if kwh is None else None)
        return {"wall_seconds": wall, "cpu_seconds": cpu, "energy_kwh": kwh or 0.0, "energy_missing": missing,
                "segments": segments, "train_flops": train, "eval_passes": self.eval_passes,
                "eval_flops": evalf, "extra_flops": self.extra_by_label(), "forecast": self.forecast,
                "contention": self.contention_record(), "step_flops": self._rate_record()}

    def _rate_record(self) -> Optional[list]:
        f, step = self._rate()
        return None if f is None else [f.total, f.forward, f.samples, step]

    def load_state_dict(self, sd: dict) -> None:
        self.prior = {k: sd[k] for k in ("wall_seconds", "cpu_seconds", "energy_kwh", "energy_missing", "segments")}
        self.prior["train_flops"] = sd.get("train_flops", 0.0)
        self.prior["extra_flops"] = dict(sd.get("extra_flops", {}))
        self.eval_passes, self.forecast = sd.get("eval_passes", 0), sd.get("forecast")
        self.prior["contention"] = sd.get("contention")
        if sd.get("step_flops"):  # older checkpoints: none
            total, forward, samples, step = sd["step_flops"]
            self.prior_step = (StepFlops(total, forward, samples), step)
        # eval passes of earlier segments, at their own rates (older checkpoints: counted at this one's)
        self.prior["eval_flops"] = sd.get("eval_flops", 0.0)
        if "eval_flops" in sd:
            self._passes0 = self.eval_passes


def timed_co2e(record: dict, kwh: Optional[float]) -> dict:
    """ledger.json `co2e` of a run timed by a forecast: the sum over the intervals it trained in of
    kWh x that interval's intensity; `g_per_kwh` the intensity paid on average (by kWh; by steps
    when energy is not measured, and then no kg)."""
    out = {**record, "source": f"forecast {record['forecast']}, per interval (co2e.intervals)",
           "method": "sum over intervals of energy kWh x the forecast's intensity", "grid": "forecast"}
    parts = [(i["kwh"], i["g_per_kwh"]) for i in record["intervals"]]
    if kwh is not None and parts and all(k is not None for k, _ in parts):
        kg = sum(k * g for k, g in parts) / 1000
        return {**out, "kg": kg, "g_per_kwh": kg * 1000 / kwh if kwh else record["g_per_kwh_by_steps"],
                "missing_reason": None}
    return {**out, "kg": None, "g_per_kwh": record["g_per_kwh_by_steps"],
            "missing_reason": "no energy figure (see energy.missing_reason); g_per_kwh is by steps"}


def _no_energy(setting: str) -> dict:
    return {"kwh": None, "method": None, "how": None, "components_kwh": None, "components_method": None,
            "source": None, "notes": [],
            "missing_reason": "ledger.energy=off" if setting == "off" else "no energy meter"}
