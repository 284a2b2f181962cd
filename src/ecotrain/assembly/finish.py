"""Finishing a run: the final weights (best, else the last evaluated), the methods' `finalize`,
one test pass, the train/val gap, and the run folder's results: model.safetensors,
summary.json (schema: `Summary`) and ledger.json."""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

import torch

from ecotrain.assembly.assemble import Run
from ecotrain.core.loop import evaluate_split
from ecotrain.data.sources import LoaderSource, subset
from ecotrain.core.device import combine_memory, memory_peaks
from ecotrain.base.rundir import write_json
from ecotrain.base.runfiles import RunFiles
from ecotrain.base.tensorfile import save_weights
from ecotrain.tracking import after_finish
from ecotrain.base.version import __version__


@dataclass
class Summary:
    """summary.json. Optional figures are left out when they do not apply (None)."""

    name: str
    steps: int  # optimizer steps, all segments
    epochs: int  # completed epochs
    samples_seen: int
    stopped_because: str  # max_steps | max_epochs | early_stopping | diverged | preempted | budget:<name>
    train_seconds: float  # the loop's wall time, all segments (set-up, final test and saves excluded)
    steps_per_second: Optional[float]
    best_val_metric: Optional[float]  # of `monitor`, on the validation split
    best_step: Optional[int]
    monitor: str
    dataset_hash: str  # sha256 of every split's content
    versions: dict  # python, torch, ecotrain
    device: str
    world_size: int  # the last segment's (torchrun processes)
    last_checkpoint: Optional[str]
    oom_recoveries: int  # Counters, summed over segments
    skipped_nonfinite_steps: int
    rollbacks: int = 0  # divergence.action=rollback: reloads of the last good checkpoint
    resumes: int = 0  # segments that continued from a checkpoint (a kill, a preemption, torchrun's restarts)
    steps_redone: int = 0  # steps the interrupted segments trained past their last checkpoint (trained again)
    checkpoint_blocked_seconds: float = 0.0  # the training loop's time inside checkpoint saves, all segments
    micro_batches: Optional[int] = None  # the micro-batch count OOM recovery settled on
    fp16_skipped_steps: Optional[int] = None  # fp16-mixed only: steps the grad scaler skipped
    padding_ratio: Optional[float] = None  # bucketed sequences: padding tokens / all tokens (epoch 0)
    samples_per_second: Optional[float] = None  # training samples, all ranks, per second of the loop
    tokens_seen: Optional[float] = None  # a language model: samples trained (all ranks) x tokens per sample
    tokens_per_second: Optional[float] = None  # tokens_seen per second of the loop (ledger.json `tokens`: per token)
    data_wait_share: Optional[float] = None  # share of the loop's time spent waiting for batches (data/loader.py)
    gpu_peak_memory_bytes: Optional[int] = None  # CUDA only: the allocator's peak, the largest rank's (ledger.json memory)
    # data.on_bad_shard=skip: {"shards": {file: what was wrong}, "samples": left out at start-up, "batch_reads":
    # reads of a damaged sample that training batches left out (a sample read in 3 epochs counts 3)}
    data_skipped: Optional[dict] = None
    memory_plan: Optional[dict] = None  # memory.budget: the plans measured and the one chosen (memory/planner.py)
    # csv data: {"columns": the feature columns' names, in order}, the model's input contract (inference.py)
    inputs: Optional[dict] = None
    methods: dict = field(default_factory=dict)  # each method's own figures, by key
    metrics: dict = field(default_factory=dict)  # train_*, val_*, test_* and train_val_gap (flattened)

    def to_json(self) -> dict:
        d = asdict(self)
        metrics = d.pop("metrics")
        if not d["methods"]:
            del d["methods"]
        return {**{k: v for k, v in d.items() if v is not None or k in _ALWAYS}, **metrics}


_ALWAYS = {"best_val_metric", "best_step", "last_checkpoint", "steps_per_second"}


def finish(run: Run) -> dict:
    """Test once on the final weights, measure the train/val gap, write weights and summary.json."""
    state, bundle, dist = run.state, run.bundle, run.state.dist
    cfg, bare = state.config, dist.unwrap(state.model)
    restore_best = cfg.early_stopping.restore_best or not cfg.early_stopping.enabled
    if state.best_weights is not None and restore_best:
        bare.load_state_dict(state.best_weights)  # the best evaluated weights (EMA's average with EMA on)
    elif state.eval_model() is not bare:
        bare.load_state_dict(state.eval_model().state_dict())  # the last evaluated weights
    if state.methods:
        state.methods.finalize(bare, bundle)  # precise BN, pruning made permanent, ...
    weights = dist.full_state_dict(state.model)  # a collective under FSDP: every rank takes part
    if dist.is_main:
        save_weights(RunFiles(run.folder.path).model, weights)
        exported = state.methods.export(bare) if state.methods else {}
        if exported:
            save_weights(RunFiles(run.folder.path).export, exported)
    dist.barrier()  # the others wait for rank 0's writes here, not in the evaluation's collectives
    metrics = final_metrics(state, bundle)
    memory = combine_memory(dist.gather_objects(memory_peaks(state.device)))  # every rank's peaks
    summary = make_summary(run, metrics, memory).to_json()
    if dist.is_main:
        write_json(RunFiles(run.folder.path).summary, summary)
    run.cbs.on_finished(state, memory)  # the wings' own files (ledger.json): on rank 0 only, they know
    if dist.is_main:
        after_finish(run, summary)  # environment.json, then the trackers' last upload (tracking/)
    return summary


def final_metrics(state, bundle) -> dict:
    out: dict[str, Any] = {}
    n_gap = min(len(bundle.train), 5000)  # enough to measure the gap without a full pass on big data
    train_m = evaluate_split(state, _head(bundle.train, n_gap), "train", final=True)
    out.update(train_m)
    if bundle.val is not None:
        val_m = evaluate_split(state, bundle.val, "val", final=True)
        out.update(val_m)
        key = "accuracy" if "train_accuracy" in train_m else "loss"
        out["train_val_gap"] = round(train_m[f"train_{key}"] - val_m[f"val_{key}"], 6)
    if bundle.test is not None:
        out.update(evaluate_split(state, bundle.test, "test", final=True))
    return out


def make_summary(run: Run, metrics: dict, memory: Optional[dict] = None) -> Summary:
    state, cfg, c = run.state, run.state.config, run.state.counters
    secs = state.train_seconds
    per_sample = run.facts.get("tokens_per_sample")
    tokens = state.samples_seen * state.dist.world_size * per_sample if per_sample else None
    return Summary(
        name=cfg.name, steps=state.step, epochs=state.epoch, samples_seen=state.samples_seen,
        stopped_because=state.stopped_because or "", train_seconds=round(secs, 4),
        steps_per_second=round(state.step / secs, 2) if secs > 0 else None,
        best_val_metric=state.best_metric, best_step=state.best_step, monitor=cfg.early_stopping.monitor,
        dataset_hash=run.bundle.content_hash, versions=versions(), device=str(state.device),
        world_size=state.dist.world_size, last_checkpoint=state.last_checkpoint,
        oom_recoveries=c.oom_recoveries, skipped_nonfinite_steps=c.skipped_nonfinite_steps, rollbacks=c.rollbacks,
        resumes=c.resumes, steps_redone=c.steps_redone,
        checkpoint_blocked_seconds=round(c.checkpoint_blocked_seconds, 4),
        micro_batches=state.plan.raised,
        fp16_skipped_steps=state.precision.skipped_steps if state.precision.scaler else None,
        padding_ratio=run.facts.get("padding_ratio"),
        samples_per_second=round(state.samples_seen * state.dist.world_size / secs, 2) if secs > 0 else None,
        tokens_seen=tokens, tokens_per_second=round(tokens / secs, 2) if tokens is not None and secs > 0 else None,
        data_wait_share=round(c.data_wait_seconds / secs, 4) if secs > 0 else None,
        gpu_peak_memory_bytes=(memory or {}).get("gpu_peak_allocated_bytes"),
        data_skipped=data_skipped(run.bundle.extra.get("data_skipped"), c.skipped_samples),
        memory_plan=run.memory_plan, inputs=run.bundle.extra.get("inputs"),
        methods=state.methods.summary() if state.methods else {}, metrics=metrics)


def data_skipped(at_start: Optional[dict], in_training: int) -> Optional[dict]:
    """What `data.on_bad_shard: skip` left out: found at start-up, and read in training batches
    (summed over resumed segments)."""
    if not at_start and not in_training:
        return None
    return {**(at_start or {"shards": {}, "samples": 0}), "batch_reads": in_training}


def preempted_summary(run: Run) -> dict:
    """A preempted run is not finished: no test, no final weights; its ledger so far is written."""
    run.cbs.on_finished(run.state, combine_memory([memory_peaks(run.state.device)]))  # this process's peaks
    return {"stopped_because": "preempted", "steps": run.state.step, "checkpoint": run.state.last_checkpoint,
            "notice_to_checkpoint_s": run.state.notice_to_checkpoint_s}


def versions() -> dict:
    return {"python": platform.python_version(), "torch": torch.__version__, "ecotrain": __version__}


def _head(source, n: int):
    if isinstance(source, LoaderSource):  # its length may be unknown (a stream, endless or not)
        return source.head(n)
    return source if len(source) <= n else subset(source, torch.arange(n))
