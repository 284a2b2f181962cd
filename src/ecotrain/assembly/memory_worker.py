"""The measuring process of the memory planner (memory.measure.run_job starts it): a few real steps
of a candidate plan through `fit()` itself, printing the peak and step time as one JSON line.

    python -m ecotrain.assembly.memory_worker FOLDER [FD]   (FOLDER/job.json: the job; FD: the parent's pipe)

A program on top of the trainer, so the planner itself (memplan_measure) never imports `fit`.

With `eval_batches` in the job, the worker then evaluates that many batches of the validation split
(the training split when there is none) at the plan's evaluation batch, as the run's evaluation
does (`loop.evaluate`, no gradients), and reports the peak after it as `eval_peak_bytes`: on CUDA the
allocator's peak since the training steps, on CPU the process's peak RSS (VmHWM), which includes training's
(RSS peaks never go down), less the second copy of the data loaded for it.

Under torchrun's measuring group (memory/shard.py) every rank runs this with RANK set: the model state
it reports is its own shard's, and rank 0 alone estimates the candidates' activations.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from ecotrain.base.orphans import watch_parent

if __name__ == "__main__" and len(sys.argv) > 2:  # before torch: importing it takes seconds under load, and a
    watch_parent(int(sys.argv[2]), Path(sys.argv[1]))  # parent killed meanwhile must not leave this process behind

import torch  # noqa: E402

from ecotrain.base import safefile
from ecotrain.callbacks import Callback
from ecotrain.config import Config
from ecotrain.data import load_data
from ecotrain.core.device import memory_peaks
from ecotrain.base.errors import EcotrainError
from ecotrain.core.loop import evaluate
from ecotrain.memory.measure import estimates, peak_rss, rss_now
from ecotrain.memory.estimate import optim_states
from ecotrain.memory.shard import strategy_bytes
from ecotrain.assembly.trainer import fit


def worker(folder: Path) -> None:
    job = safefile.read_json(folder / "job.json", "memory measurement job", 64 * safefile.MiB)
    cfg = Config.model_validate(job["config"])
    steps = cfg.loop.max_steps

    class Meter(Callback):
        def __init__(self):
            self.times, self.cpu, self.t0, self.c0 = [], [], 0.0, 0.0

        def on_fit_start(self, state):
            state.plan.raise_micro_batches(job["micro_batches"])  # the candidate's cut (exact accumulation)
            trainable = sum(_local(p).nelement() for p in state.model.parameters() if p.requires_grad)
            self.optim_bytes = trainable * 4 * optim_states(cfg)  # fp32 optimizer state
            self.state_bytes = trainable * 4 + self.optim_bytes  # and fp32 gradients
            self.strategy_bytes = strategy_bytes(state.model, job.get("strategy"))
            if state.device.type == "cuda":
                gpu = memory_peaks(state.device)  # said before a step can fail
                print(json.dumps({"worker_device": {k: gpu[k] for k in ("gpu_name", "gpu_total_bytes")}}), flush=True)
                torch.cuda.reset_peak_memory_stats(state.device)
                self.start, self.start_peak = torch.cuda.memory_allocated(state.device), 0
            else:
                self.start, self.start_peak = rss_now(), peak_rss()

        def on_step_start(self, state):
            self.t0, self.c0 = time.perf_counter(), time.process_time()

        def on_step_end(self, state):
            self.times.append(time.perf_counter() - self.t0)
            self.cpu.append(time.process_time() - self.c0)
            if state.step < steps:
                return
            cuda = state.device.type == "cuda"
            peaks = memory_peaks(state.device)  # the same figures as the run's ledger
            peak = peaks["gpu_peak_allocated_bytes"] if cuda else peak_rss()  # CPU: not the ledger's ru_maxrss
            fastest = min(range(1, len(self.times)), key=self.times.__getitem__)
            out = {"peak_bytes": int(peak), "step_seconds": self.times[fastest],
                   "cpu_seconds": None if cuda else min(self.cpu[1:]), "device_type": state.device.type,
                   "reserved_bytes": peaks["gpu_peak_reserved_bytes"],
                   "micro_batches": state.plan.micro_batches,
                   "start_bytes": self.start, "start_peak_bytes": self.start_peak, "state_bytes": self.state_bytes,
                   "optim_bytes": self.optim_bytes, "oom_recoveries": state.counters.oom_recoveries,
                   "strategy_bytes": self.strategy_bytes,
                   "activations": {}, "n_blocks": 0, "chunkable": False}
            if job.get("eval_batches"):  # after the training peak is read
                out["eval_peak_bytes"] = eval_peak(state, job["eval_batches"])
            ranks = job.get("ranks", 1)  # a group: another rank may be over, so rank 0 always estimates
            if job["estimate"] and (peak > job["usable"] or ranks > 1) and state.dist.rank == 0:
                # after the peaks are read: its forwards are not measured
                out["activations"], out["n_blocks"], out["chunkable"] = estimates(
                    Config.model_validate(job["estimate"]), ranks, job.get("strategy"))
            print(json.dumps(out), flush=True)
            os._exit(0)  # the plan's training steps are what is measured; no final evaluation

    fit(cfg, callbacks=[Meter()], run_dir=folder / "run", quiet=True)
    raise SystemExit(f"the run stopped before step {steps} (loop.max_epochs ended it: set loop.max_epochs=null "
                     "for the measurement)")


def _local(p: torch.Tensor) -> torch.Tensor:
    """This rank's part of a parameter: its shard under FSDP (a DTensor), else the whole."""
    return p.to_local() if hasattr(p, "to_local") else p


class _Head:
    """The first `n` samples of a source (Source protocol: len and take)."""

    def __init__(self, source, n: int):
        self.source, self.n = source, min(n, len(source))

    def __len__(self) -> int:
        return self.n

    def take(self, idx):
        return self.source.take(idx)


def eval_peak(state, batches: int) -> int:
    """The peak once `batches` evaluation batches of `state.plan.eval_batch` samples have run."""
    cuda = state.device.type == "cuda"
    before = rss_now()
    bundle = load_data(state.config)  # the run's own copy is out of reach of a callback; this one is not counted
    source = bundle.val if bundle.val is not None and len(bundle.val) else bundle.train
    copy = max(0, rss_now() - before)
    if cuda:
        torch.cuda.reset_peak_memory_stats(state.device)
    evaluate(state.model, _Head(source, batches * state.plan.eval_batch), state.task, state.plan.eval_batch,
             state.device, state.precision)
    if cuda:
        return int(torch.cuda.max_memory_allocated(state.device))
    return int(max(0, peak_rss() - copy))


if __name__ == "__main__":  # the parent's pipe (measure.run_job) is watched from the top, before torch
    try:
        worker(Path(sys.argv[1]))
    except EcotrainError as exc:  # the user's one line reaches the parent's message, not a traceback
        print(exc, file=sys.stderr)
        sys.exit(exc.exit_code)
