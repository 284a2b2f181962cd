"""`threads: auto` chosen for what is paid (threads.pick): before the run's first step, and before the
ledger starts its clocks, a short probe of the run's own config with each candidate thread count (1,
2, 4, ... the usable cores), each at two lengths in its own process, measures the steady-state step
(the difference, so set-up, test and save cancel) and decides by kWh per step (or seconds, or money:
ECOTRAIN_THREADS_FOR); more threads only where they pay no more energy and no more money per step than
one thread. The decision is kept per recipe and machine (threads.json in the cache), so a
seed trains with the same count every time on one machine; a resume keeps its checkpoint's count
(threads.for_fit). One log line says the choice and its reason; ledger.json `threads` records it and
the probes' own cost (paid once per recipe and machine, not in the run's figures)."""

from __future__ import annotations

import copy
import os
from typing import Optional

import torch

from ecotrain.core import threads
from ecotrain.callbacks.base import Callback
from ecotrain.base.log import log

# sections a probe must not inherit: it would wait for a clean grid, stop on the run's budget, report
# to a tracker, poll a preemption notice or write where the run writes
_NEUTRAL = {"carbon": {}, "budget": {}, "tracking": {"mlflow": None, "tensorboard": None}, "preemption": {},
            "logging": {"progress": "off"}, "early_stopping": {"enabled": False}}


def wanted(cfg, device) -> Optional[int]:
    """The most threads to probe up to, or None when no probe applies: `threads` set, the user's
    OMP_NUM_THREADS, a library call (no CLI preset), one usable core, a GPU run, torchrun ranks, or
    ECOTRAIN_THREADS_PROBE=0."""
    if cfg.threads == "auto" and os.environ.get(threads.PROBE_ENV) != "0":
        threads.objective()  # a misspelt ECOTRAIN_THREADS_FOR is one line before the run, not a warning in it
    preset = threads.preset()
    if (cfg.threads != "auto" or preset is None or preset.source != "auto" or share(preset) < 2
            or getattr(device, "type", "cpu") != "cpu" or os.environ.get(threads.PROBE_ENV) == "0"
            or int(os.environ.get("WORLD_SIZE", "1") or 1) > 1 or torch.get_num_threads() != preset.threads):
        return None
    return share(preset)


def share(preset) -> int:
    """The machine's cores for this process (affinity, quota, local ranks, loader workers), whatever the
    load is now: the probe's ceiling and part of its cache key, so a decision does not depend on how busy
    the machine happened to be when a run started (the load-based count does)."""
    return max(1, preset.cores // max(1, preset.local_ranks) - preset.workers)


def probe_config(cfg) -> dict:
    out = copy.deepcopy(cfg.to_dict())
    for k, v in _NEUTRAL.items():
        if k in out:
            out[k] = v if not isinstance(out[k], dict) else {**out[k], **v} if k == "logging" else v
    return out


class ThreadPick(Callback):
    before = ("ContentionWatch", "Ledger")  # the probe's time is not the run's

    def __init__(self, cfg, most: int, ledger=None):
        self.cfg, self.most, self.ledger = cfg, most, ledger
        self.record: Optional[dict] = None

    def on_fit_start(self, state):
        if state.step > 0 or state.counters.resumes:  # a resume keeps its checkpoint's count (exact)
            return
        busy = torch.get_num_threads() < self.most  # other processes hold cores now (threads.choose)
        try:
            rec = threads.pick(probe_config(self.cfg), self.most, threads.objective(), probe=not busy)
        except Exception as exc:  # noqa: BLE001 - a failed probe leaves auto as the cores allow, said once
            log.warning(f"threads: the probe failed ({exc}); training with {torch.get_num_threads()} threads "
                        f"(auto, as the cores allow)")
            return
        if rec is None:  # busy and never decided: a probe now would measure the neighbours
            log.info(f"threads: {torch.get_num_threads()} (auto: other processes hold cores now); no probe while "
                     f"the machine is busy, a quiet run of this recipe decides for later ones")
            return
        if rec["threads"] != torch.get_num_threads():
            torch.set_num_threads(rec["threads"])
        log.info(rec["line"])
        self.record = {k: rec.get(k) for k in ("threads", "objective", "method", "probes", "when", "cached",
                                               "probe_cost", "line")}
        if self.ledger is not None:
            self.ledger.threads_pick = self.record
