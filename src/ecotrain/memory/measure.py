"""Measuring one memory plan (memory/planner.py): a few real training steps in a fresh process.

The parent (`run_job`) writes the job (a config, the micro-batch count) to a temporary folder and
runs `python -m ecotrain.memory.measure JOB`; the child trains `memory.search_steps` steps with
`fit()` (the same assembly, loop, callbacks and ledger as the run itself) in that folder, then
prints one JSON line and exits without the final evaluation. Two callers: `measure` (a memory.budget
candidate: the run's config with the candidate's levers) and `measure_config` (`ecotrain plan`'s
measured line: the config exactly as written). Peak (device.memory_peaks, as the ledger reads it):
on CPU the process's peak RSS (`ru_maxrss`, which never goes down: hence one process per plan); on
CUDA the allocator's `max_memory_allocated` (and `max_memory_reserved`, what its cache held); on CPU
the peak is read as /proc's VmHWM (`peak_rss`), which, unlike `ru_maxrss`, does not inherit the
parent's peak. Step
time: the fastest step after the first (which allocates the optimizer state and, with the ledger
on, counts FLOPs). A memory.budget candidate then evaluates a few batches at its evaluation batch, and
the peak after that is its `eval_peak_bytes`.
The first (baseline) job also estimates every candidate's activations with `ecotrain plan`'s
saved-tensor measurement, after its peak has been read.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

import torch

from ecotrain.data import load_data
from ecotrain.memory import planner
from ecotrain.device import host_peak_rss
from ecotrain.errors import EXIT_USAGE, ConfigError, EcotrainError
from ecotrain.log import log
from ecotrain.memory.chunked_loss import applies as chunked_loss_applies, apply_chunked_loss
from ecotrain.memory.estimate import activations_at, optim_states, saved_profile
from ecotrain.memory.levers import find_blocks, offload_targets, select_modules
from ecotrain.memory.planner import Baseline, Candidate, Measured
from ecotrain.models import build_model
from ecotrain.orphans import parent_pipe
from ecotrain.precision import Precision
from ecotrain.stepplan import eval_batch_size
from ecotrain.task import build_task

TIMEOUT_S = 3600
EVAL_BATCHES = 2  # evaluation batches a measured plan runs: its peak is reached in the first


def _job_config(cfg) -> dict:
    """`cfg` as a measuring job: `memory.search_steps` steps, nothing that writes outside the job's folder."""
    d = cfg.to_dict()
    d["memory"]["budget"] = None
    d["loop"]["max_steps"] = cfg.memory.search_steps
    d["checkpoint"].update(at_end=False, every_minutes=None, every_n_steps=None, every_epoch=False, on_best=False)
    d["logging"]["progress"] = "off"
    d["tracking"] = {}
    d["threads"] = torch.get_num_threads()  # the run's own count (threads.for_fit set it)
    return d


@dataclass
class JobResult:
    out: Optional[dict]  # the worker's result line; None when it failed
    device: dict  # where it ran: gpu_name and gpu_total_bytes on CUDA (read before the first step)
    seconds: float  # wall time of the process, start-up included
    error: str = ""  # a failure's last line
    returncode: int = 0


def run_job(job: dict) -> JobResult:
    """The worker on `job` ({"config", "micro_batches", "estimate", "usable"}) in a fresh process."""
    tmp = Path(tempfile.mkdtemp(prefix="ecotrain-memplan-"))
    # the worker watches this pipe: killed here, this process cannot remove `tmp`, the worker does (orphans.py)
    watch, held = parent_pipe()
    try:
        (tmp / "job.json").write_text(json.dumps(job))
        env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "ecotrain.memory.worker", str(tmp), str(watch)],
                           capture_output=True, text=True, env=env, timeout=TIMEOUT_S, pass_fds=(watch,))
        seconds = time.perf_counter() - t0
    finally:
        os.close(watch)
        os.close(held)
        shutil.rmtree(tmp, ignore_errors=True)
    lines = [_json(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
    device = next((ln["worker_device"] for ln in lines if "worker_device" in ln), {})
    out = next((ln for ln in reversed(lines) if "peak_bytes" in ln), None)
    if r.returncode != 0 or out is None:
        tail = (r.stderr.strip().splitlines() or [f"exit code {r.returncode}"])[-1]
        return JobResult(None, device, seconds, tail, r.returncode or 1)
    return JobResult(out, device, seconds)


def _json(line: str) -> dict:
    try:
        return json.loads(line)
    except json.JSONDecodeError:  # user code printed something brace-shaped: not the worker's line
        return {}


def measure(cfg, c: Candidate, first: bool):
    """Measured (and with `first`, a Baseline) of candidate `c`, from a fresh process."""
    job = {"config": _job_config(planner.applied(cfg, c)), "micro_batches": c.micro_batches, "candidate": c.key,
           "estimate": cfg.to_dict() if first else None,  # the user's config: its checkpointing spec
           "usable": cfg.memory.budget * (1 - cfg.memory.budget_margin),
           "eval_batches": EVAL_BATCHES if c.eval_batch else 0}
    r = run_job(job)
    if r.out is None:
        error = ConfigError if r.returncode == EXIT_USAGE else EcotrainError  # the user's config: exit code 2
        raise error(f"memory.budget: measuring the plan '{c.describe(cfg.data.batch_size * cfg.loop.accumulate)}' "
                    f"failed: {r.error}")
    out = r.out
    peak = out["peak_bytes"] if not out["oom_recoveries"] else max(out["peak_bytes"], cfg.memory.budget + 1)
    m = Measured(c, int(peak), float(out["step_seconds"]), r.seconds, cpu_seconds=out["cpu_seconds"],
                 eval_peak_bytes=out.get("eval_peak_bytes"))
    if not first:
        return m
    return m, Baseline(out["start_bytes"], out["start_peak_bytes"], out["state_bytes"], out["activations"],
                       out["n_blocks"], out.get("optim_bytes", 0), out.get("chunkable", False))


def measure_config(cfg) -> JobResult:
    """`memory.search_steps` training steps of `cfg` exactly as configured (its checkpointing,
    accumulation, precision, device) in a fresh process: `ecotrain plan`'s measured peak."""
    return run_job({"config": _job_config(cfg), "micro_batches": cfg.loop.accumulate, "candidate": "as configured",
                    "estimate": None, "usable": float("inf"), "eval_batches": 0})


def peak_rss() -> int:
    """This process's peak RSS since its `exec`: /proc's VmHWM. Not `ru_maxrss`: Linux carries the
    spawning process's peak into the child's `ru_maxrss` at exec, so a worker started by a large
    parent (a notebook, the bench, pytest) would report at least the parent's peak."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return host_peak_rss() or 0  # not Linux: the rusage figure is the best there is


def rss_now() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):  # not Linux: the peak so far is the best figure there is
        return host_peak_rss() or 0


def estimates(cfg) -> tuple[dict, int, bool]:
    """(candidate key -> estimated activation bytes of one micro-batch, by memory/estimate.py's method, for the
    user's config `cfg` (its own checkpointing spec names the modules of the "modules" candidates); the
    model's blocks; whether the chunked loss applies). The chunked loss's plans are profiled on the model
    with its head chunked (what it saves: the hidden states and one float per token), plus one chunk's
    logits and their gradient, alive at once in its forward and backward."""
    bundle = load_data(cfg)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, bundle.input_shape, bundle.num_classes)
    task = build_task(cfg, bundle.sample, lm=bundle.extra.get("task") == "lm", num_classes=None)
    blocks = find_blocks(model)
    named = planner.names_modules(cfg)
    mods = select_modules(model, cfg.memory.activation_checkpointing) if named else []
    every = blocks + [(n, m) for n, m in mods if n not in {b for b, _ in blocks}]
    batch = cfg.data.batch_size * cfg.loop.accumulate
    chunkable = chunked_loss_applies(model, task) and not cfg.methods  # a method may read the logits
    cands = planner.candidates(len(blocks), named, batch, cfg.loop.accumulate, cfg.memory.min_micro_batch,
                               cfg.precision, cfg.memory.allow_precision_change, cfg.memory.budget_levers,
                               chunkable=chunkable, has_optim_state=optim_states(cfg) > 0)
    profiles = {}
    for chunked in dict.fromkeys(c.chunked for c in cands):  # False first: chunking changes the model's head
        if chunked:
            head = apply_chunked_loss(model, cfg.memory.loss_chunk)
        for p in dict.fromkeys(c.precision for c in cands):
            profiles[p, chunked] = saved_profile(bundle, model, task, Precision(p, torch.device("cpu")), every)
    out = {}
    for c in cands:
        if c.checkpointing == "modules":
            chosen = mods
        elif c.checkpointing.startswith("every_n:"):
            chosen = blocks[::int(c.checkpointing.split(":")[1])]
        else:
            chosen = blocks if c.checkpointing == "all" else []
        names = {n for n, _ in chosen}
        offloaded = ({n for n, _ in offload_targets(model, sorted(names))[:c.offload_blocks]}
                     if c.offload != "off" else set())
        micro = -(-batch // c.micro_batches)
        out[c.key] = int(activations_at(*profiles[c.precision, c.chunked], names, micro, c.policy, offloaded))
        if c.chunked:  # one chunk's float32 logits and their gradient
            out[c.key] += 2 * 4 * head.out_features * min(cfg.memory.loss_chunk, micro * _tokens(bundle))
    return out, len(blocks), chunkable


def _tokens(bundle) -> int:
    """Tokens per sample of a sequence dataset: its longest training sample's."""
    lengths = bundle.extra.get("lengths")
    return int(lengths.max()) if lengths is not None else int(bundle.input_shape[-1])


# ---------------------------------------------------------------- choosing for a run


def first_candidate(cfg) -> Candidate:
    """The least constrained plan: no checkpointing, the configured micro-batches and precision."""
    batch = cfg.data.batch_size * cfg.loop.accumulate
    return Candidate("off", cfg.loop.accumulate, cfg.precision,
                     eval_batch=planner.eval_batch_of(eval_batch_size(cfg), batch, cfg.loop.accumulate))


def run_search(cfg, memo: Optional[dict] = None) -> planner.Search:
    """Measure and choose for `cfg` (its `memory.budget` set). `memo` (candidate key -> what `measure`
    returned), shared by searches of one config at several budgets, measures each plan once (a
    plan's peak and time do not depend on the budget; bench/memory_budget.py)."""
    batch = cfg.data.batch_size * cfg.loop.accumulate

    def expand(info: Baseline) -> list[Candidate]:
        return planner.candidates(info.n_blocks, planner.names_modules(cfg), batch, cfg.loop.accumulate,
                                  cfg.memory.min_micro_batch, cfg.precision, cfg.memory.allow_precision_change,
                                  cfg.memory.budget_levers, eval_batch_size(cfg), info.chunkable,
                                  info.optim_bytes > 0)

    def measured(c: Candidate, first: bool):
        hit = memo.get(c.key) if memo is not None else None
        if hit is None or (first and not isinstance(hit, tuple)) or (first and not hit[1].activations):
            hit = measure(cfg, c, first)
            if memo is not None:
                memo[c.key] = hit
        if isinstance(hit, tuple) and not first:
            hit = hit[0]
        return (replace(hit[0]), hit[1]) if isinstance(hit, tuple) else replace(hit)

    return planner.search(first_candidate(cfg), expand, cfg.memory.budget, cfg.memory.budget_margin, measured,
                          cfg.memory.search_candidates)


def with_offload_dir(cfg, run_dir: Path):
    """`cfg` with CPU activation offload writing to the run folder (unless memory.offload_dir names one)."""
    if cfg.memory.activation_offload == "off" or cfg.memory.offload_dir:
        return cfg
    d = cfg.to_dict()
    d["memory"]["offload_dir"] = str(run_dir)
    return type(cfg).model_validate(d)


def for_run(cfg, run_dir: Path, resume, own_parts: list[str], world_size: int):
    """(the config to train, with the chosen plan's levers; the Search or None). A resume reads the
    choice its run folder recorded and measures nothing."""
    if cfg.memory.budget is None:
        return with_offload_dir(cfg, run_dir), None
    if own_parts:
        raise EcotrainError(f"memory.budget: plans are measured in fresh processes built from the config, so "
                            f"fit({own_parts[0]}=...) cannot be part of them; set memory.activation_checkpointing "
                            "and loop.accumulate by hand (see `ecotrain plan`), or drop memory.budget")
    if world_size > 1:
        raise EcotrainError("memory.budget: measured for one process; under torchrun set the levers by hand "
                            "(`ecotrain plan RECIPE --budget ...` on one process shows them)")
    folders = [run_dir] + ([Path(resume).parent.parent] if resume is not None else [])
    rec = planner.read_record(*folders) if resume is not None else None
    same = rec is not None and rec.get("chosen") and rec.get("budget_bytes") == cfg.memory.budget
    if resume is not None and not same:
        log.warning(f"memory.budget: {'no plan recorded' if rec is None else 'the budget changed'} in {run_dir}; "
                    "measuring the plans again")
    s = planner.from_record(rec) if same else run_search(cfg)
    batch = cfg.data.batch_size * cfg.loop.accumulate
    if s.chosen is None:
        raise ConfigError(planner.none_fits_line(s, batch))
    planner.log_choice(s, batch)
    return with_offload_dir(planner.applied(cfg, s.chosen.candidate), run_dir), s
