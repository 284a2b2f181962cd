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
Under torchrun (`ranks` > 1) a job is N workers, a process group on this machine (memory/shard.py),
and its figures are the largest rank's: the per-rank peak a budget bounds, the slowest rank's step.
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
from ecotrain.memory import planner, shard
from ecotrain.core.device import host_peak_rss
from ecotrain.core.distributed import under_torchrun
from ecotrain.base.errors import EXIT_USAGE, ConfigError, EcotrainError
from ecotrain.base.log import log
from ecotrain.core.chunked_loss import applies as chunked_loss_applies, apply_chunked_loss
from ecotrain.memory.estimate import activations_at, optim_states, saved_profile
from ecotrain.core.levers import find_blocks, offload_targets, select_modules
from ecotrain.memory.planner import Baseline, Candidate, Measured
from ecotrain.models import build_model
from ecotrain.base.orphans import parent_pipe
from ecotrain.core.precision import Precision
from ecotrain.core.stepplan import eval_batch_size
from ecotrain.core.task import build_task

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


def run_job(job: dict, ranks: int = 1) -> JobResult:
    """The worker on `job` ({"config", "micro_batches", "estimate", "usable"}) in a fresh process, or
    in `ranks` fresh processes that form a process group of their own (shard.group_env): always under
    torchrun, whose environment names the job's own group."""
    tmp = Path(tempfile.mkdtemp(prefix="ecotrain-memplan-"))
    # the worker watches this pipe: killed here, this process cannot remove `tmp`, the worker does (orphans.py)
    watch, held = parent_pipe()
    try:
        (tmp / "job.json").write_text(json.dumps({**job, "ranks": ranks}))
        env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
        cmd = [sys.executable, "-m", "ecotrain.assembly.memory_worker", str(tmp), str(watch)]
        t0 = time.perf_counter()
        if ranks == 1 and not under_torchrun():
            r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=TIMEOUT_S, pass_fds=(watch,))
            runs = [(r.returncode, r.stdout, r.stderr)]
        else:
            runs = _group(cmd, env, ranks, tmp, watch)
        seconds = time.perf_counter() - t0
    finally:
        os.close(watch)
        os.close(held)
        shutil.rmtree(tmp, ignore_errors=True)
    results = [_result(*run) for run in runs]
    device = results[0][1]
    failed = [(code, tail) for out, _, code, tail in results if out is None]
    if failed:  # a rank's own error before another's lost contact; the user's config (exit code 2) first
        code, tail = next((f for f in failed if f[0] == EXIT_USAGE), failed[0])
        return JobResult(None, device, seconds, tail, code or 1)
    return JobResult(_largest([out for out, *_ in results]), device, seconds)


def _group(cmd: list, env: dict, ranks: int, tmp: Path, watch: int) -> list[tuple[int, str, str]]:
    """(exit code, stdout, stderr) of each of `ranks` workers of one process group. Their output goes to
    files (pipes read one at a time could fill and stall a rank inside a collective)."""
    port = shard.free_port()
    procs, files = [], []
    try:
        for rank in range(ranks):
            out, err = (open(tmp / f"rank{rank}.{k}", "w+") for k in ("out", "err"))
            files.append((out, err))
            procs.append(subprocess.Popen(cmd, stdout=out, stderr=err, text=True, pass_fds=(watch,),
                                          env=shard.group_env(env, rank, ranks, port)))
        deadline = time.monotonic() + TIMEOUT_S
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    runs = []
    for p, (out, err) in zip(procs, files):
        out.seek(0)
        err.seek(0)
        runs.append((p.returncode, out.read(), err.read()))
        out.close()
        err.close()
    return runs


def _result(code: int, stdout: str, stderr: str) -> tuple[Optional[dict], dict, int, str]:
    """(the worker's result line or None, its device, exit code, its last error line)."""
    lines = [_json(ln) for ln in stdout.splitlines() if ln.startswith("{")]
    device = next((ln["worker_device"] for ln in lines if "worker_device" in ln), {})
    out = next((ln for ln in reversed(lines) if "peak_bytes" in ln), None)
    if code != 0 or out is None:
        return None, device, code, (stderr.strip().splitlines() or [f"exit code {code}"])[-1]
    return out, device, code, ""


def _largest(outs: list[dict]) -> dict:
    """One rank's result line (rank 0's: its estimates) with the largest rank's peaks and the slowest rank's step."""
    if len(outs) == 1:
        return outs[0]
    top = {k: max(o[k] for o in outs) for k in ("peak_bytes", "step_seconds", "oom_recoveries")}
    for k in ("cpu_seconds", "eval_peak_bytes"):
        if all(o.get(k) is not None for o in outs):
            top[k] = max(o[k] for o in outs)
    return {**outs[0], **top, "rank_peaks": [o["peak_bytes"] for o in outs]}


def _json(line: str) -> dict:
    try:
        return json.loads(line)
    except json.JSONDecodeError:  # user code printed something brace-shaped: not the worker's line
        return {}


def measure(cfg, c: Candidate, first: bool):
    """Measured (and with `first`, a Baseline) of candidate `c`, from a fresh process (`c.ranks` of them)."""
    job = {"config": _job_config(planner.applied(cfg, c)), "micro_batches": c.micro_batches, "candidate": c.key,
           "estimate": cfg.to_dict() if first else None,  # the user's config: its checkpointing spec
           "usable": cfg.memory.budget * (1 - cfg.memory.budget_margin),
           "eval_batches": EVAL_BATCHES if c.eval_batch else 0, "strategy": c.strategy}
    r = run_job(job, c.ranks)
    if r.out is None:
        error = ConfigError if r.returncode == EXIT_USAGE else EcotrainError  # the user's config: exit code 2
        raise error(f"memory.budget: measuring the plan '{c.describe(cfg.data.batch_size * cfg.loop.accumulate)}' "
                    f"failed: {r.error}")
    out = r.out
    peak = out["peak_bytes"] if not out["oom_recoveries"] else max(out["peak_bytes"], cfg.memory.budget + 1)
    m = Measured(c, int(peak), float(out["step_seconds"]), r.seconds, cpu_seconds=out["cpu_seconds"],
                 eval_peak_bytes=out.get("eval_peak_bytes"), rank_peaks=out.get("rank_peaks"))
    if not first:
        return m
    return m, Baseline(out["start_bytes"], out["start_peak_bytes"], out["state_bytes"], out["activations"],
                       out["n_blocks"], out.get("optim_bytes", 0), out.get("chunkable", False),
                       out.get("strategy_bytes", 0))


def measure_config(cfg, ranks: int = 1) -> JobResult:
    """`memory.search_steps` training steps of `cfg` exactly as configured (its checkpointing,
    accumulation, precision, device) in a fresh process (`ranks` of them): `ecotrain plan`'s measured peak."""
    return run_job({"config": _job_config(cfg), "micro_batches": cfg.loop.accumulate, "candidate": "as configured",
                    "estimate": None, "usable": float("inf"), "eval_batches": 0}, ranks)


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


def estimates(cfg, ranks: int = 1, strategy: Optional[str] = None) -> tuple[dict, int, bool]:
    """(candidate key -> estimated activation bytes of one micro-batch, by memory/estimate.py's method, for the
    user's config `cfg` (its own checkpointing spec names the modules of the "modules" candidates); the
    model's blocks; whether the chunked loss applies). The chunked loss's plans are profiled on the model
    with its head chunked (what it saves: the hidden states and one float per token), plus one chunk's
    logits and their gradient, alive at once in its forward and backward. Under torchrun the plans of
    `strategy` over `ranks` ranks, whose micro-batches cut each rank's share."""
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
                               chunkable=chunkable, has_optim_state=optim_states(cfg) > 0, strategy=strategy,
                               ranks=ranks)
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
        micro = -(-(batch // ranks) // c.micro_batches)
        out[c.key] = int(activations_at(*profiles[c.precision, c.chunked], names, micro, c.policy, offloaded))
        if c.chunked:  # one chunk's float32 logits and their gradient
            out[c.key] += 2 * 4 * head.out_features * min(cfg.memory.loss_chunk, micro * _tokens(bundle))
    return out, len(blocks), chunkable


def _tokens(bundle) -> int:
    """Tokens per sample of a sequence dataset: its longest training sample's."""
    lengths = bundle.extra.get("lengths")
    return int(lengths.max()) if lengths is not None else int(bundle.input_shape[-1])


# ---------------------------------------------------------------- choosing for a run


def first_candidate(cfg, strategy: Optional[str] = None, ranks: int = 1) -> Candidate:
    """The least constrained plan: no checkpointing, the configured micro-batches and precision."""
    share = cfg.data.batch_size * cfg.loop.accumulate // ranks
    return Candidate("off", cfg.loop.accumulate, cfg.precision, strategy=strategy, ranks=ranks,
                     eval_batch=planner.eval_batch_of(eval_batch_size(cfg), share, cfg.loop.accumulate))


def run_search(cfg, memo: Optional[dict] = None, ranks: int = 1, strategies=(None,)) -> planner.Search:
    """Measure and choose for `cfg` (its `memory.budget` set), over `ranks` processes, one search per
    strategy of `strategies` (memory/shard.py; None: one process). `memo` (candidate key -> what
    `measure` returned), shared by searches of one config at several budgets, measures each plan once (a
    plan's peak and time do not depend on the budget; bench/memory_budget.py)."""
    batch = cfg.data.batch_size * cfg.loop.accumulate

    def one(strategy: Optional[str], closest: bool, beat: Optional[float] = None) -> planner.Search:
        def expand(info: Baseline) -> list[Candidate]:
            return planner.candidates(info.n_blocks, planner.names_modules(cfg), batch, cfg.loop.accumulate,
                                      cfg.memory.min_micro_batch, cfg.precision, cfg.memory.allow_precision_change,
                                      cfg.memory.budget_levers, eval_batch_size(cfg), info.chunkable,
                                      info.optim_bytes > 0, strategy, ranks)

        return planner.search(first_candidate(cfg, strategy, ranks), expand, cfg.memory.budget,
                              cfg.memory.budget_margin, measured, cfg.memory.search_candidates, closest, beat)

    def measured(c: Candidate, first: bool):
        hit = memo.get(c.key) if memo is not None else None
        if hit is None or (first and not isinstance(hit, tuple)) or (first and not hit[1].activations):
            try:
                hit = measure(cfg, c, first)
            except ConfigError as exc:  # the config refuses the strategy itself, not one plan of it
                if first and c.strategy is not None:
                    raise shard.Refused(str(exc)) from None
                raise
            if memo is not None:
                memo[c.key] = hit
        if isinstance(hit, tuple) and not first:
            hit = hit[0]
        return (replace(hit[0]), hit[1]) if isinstance(hit, tuple) else replace(hit)

    if list(strategies) == [None]:
        return one(None, True)
    return shard.search_strategies(strategies, shard.configured(cfg), one)


def with_offload_dir(cfg, run_dir: Path):
    """`cfg` with CPU activation offload writing to the run folder (unless memory.offload_dir names one)."""
    if cfg.memory.activation_offload == "off" or cfg.memory.offload_dir:
        return cfg
    d = cfg.to_dict()
    d["memory"]["offload_dir"] = str(run_dir)
    return type(cfg).model_validate(d)


def for_run(cfg, run_dir: Path, resume, own_parts: list[str], dist):
    """(the config to train, with the chosen plan's levers; the Search or None). A resume reads the
    choice its run folder recorded and measures nothing. Under torchrun (`dist`: distributed.Dist)
    rank 0 decides and every rank gets its plan (`Dist.from_main`): the same plan on all."""
    if cfg.memory.budget is None:
        return with_offload_dir(cfg, run_dir), None
    if own_parts:
        raise EcotrainError(f"memory.budget: plans are measured in fresh processes built from the config, so "
                            f"fit({own_parts[0]}=...) cannot be part of them; set memory.activation_checkpointing "
                            "and loop.accumulate by hand (see `ecotrain plan`), or drop memory.budget")
    batch = cfg.data.batch_size * cfg.loop.accumulate
    if dist.world_size == 1:
        s = decide(cfg, run_dir, resume, 1)
    else:
        shard.one_machine(dist.world_size)
        s = _from_main(dist, lambda: decide(cfg, run_dir, resume, dist.world_size), batch)
    if s.chosen is None:
        raise ConfigError(planner.none_fits_line(s, batch))
    planner.log_choice(s, batch)
    return with_offload_dir(planner.applied(cfg, s.chosen.candidate), run_dir), s


def decide(cfg, run_dir: Path, resume, world: int) -> planner.Search:
    """The recorded choice of a resumed run (same budget, same world size), else a new search; a resume's
    search keeps the recorded strategy (its checkpoints' format)."""
    folders = [run_dir] + ([Path(resume).parent.parent] if resume is not None else [])
    rec = planner.read_record(*folders) if resume is not None else None
    same = (rec is not None and rec.get("chosen") and rec.get("budget_bytes") == cfg.memory.budget
            and rec.get("ranks", 1) == world)
    if resume is not None and not same:
        why = ("no plan recorded" if rec is None else "the budget changed" if rec.get("budget_bytes") !=
               cfg.memory.budget else f"it was measured over {rec.get('ranks', 1)} rank(s), not {world}")
        log.warning(f"memory.budget: {why} in {run_dir}; measuring the plans again")
    if same:
        return planner.from_record(rec)
    pinned = (rec.get("chosen") or {}).get("strategy") if rec is not None else None
    return run_search(cfg, ranks=world, strategies=shard.strategies_for(cfg, world, pinned))


def _from_main(dist, work, batch: int) -> planner.Search:
    """Rank 0's `work()` (a Search), sent to every rank as its record; its error, raised on every rank."""
    s, payload = None, None
    if dist.is_main:
        try:
            s = work()
            payload = {"record": s.record(batch), "reused": s.reused}
        except Exception as exc:  # the other ranks raise it too instead of waiting for a plan
            payload = {"error": str(exc), "usage": isinstance(exc, ConfigError)}
            dist.from_main(payload)
            raise
    payload = dist.from_main(payload)
    if "error" in payload:
        raise (ConfigError if payload["usage"] else EcotrainError)(f"rank 0: {payload['error']}")
    if s is None:
        s = planner.from_record(payload["record"])
        s.reused = payload["reused"]
    return s
