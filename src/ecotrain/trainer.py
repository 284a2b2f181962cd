"""`fit()`: assemble a run from a Config (and optionally the user's own parts), train, test, report.

The Python API and the CLI both land here, so they get the same loop, callbacks and run folder.
"""

from __future__ import annotations

import os
import platform
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np
import torch
from safetensors.torch import save as st_save
from torch import nn

import ecotrain
from ecotrain import distributed, loop
from ecotrain.accounting import Ledger, write_ledger
from ecotrain.callbacks import (BestTracker, Callback, CallbackList, DivergenceGuard, EarlyStopping,
                                MetricsLogger, ProgressBar)
from ecotrain.config import Config
from ecotrain.data import ArraySource, DataBundle, MapSource, load_data
from ecotrain.data.augment import SignalAugment
from ecotrain import resume as resume_mod
from ecotrain.callbacks import Checkpointer
from ecotrain.checkpoint.manager import CheckpointManager
from ecotrain.checkpoint.preemption import Preemption
from ecotrain.checkpoint.state import capture
from ecotrain.data.bucketing import build_sampler, padding_ratio
from ecotrain.data.builtin import import_object, validate_arrays
from ecotrain.errors import ConfigError, DataError
from ecotrain.models import build_model
from ecotrain.optim import build_optimizer, build_scheduler
from ecotrain.memory import configure_memory
from ecotrain.precision import Precision
from ecotrain.rundir import atomic_write, default_run_dir, write_config, write_json
from ecotrain.state import TrainState
from ecotrain.task import ClassificationTask, LanguageModelTask, UserTask


@dataclass
class RunResult:
    run_dir: Path
    summary: dict
    model: nn.Module
    state: TrainState


def seed_everything(seed: int, deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # required by deterministic cuBLAS
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False


def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: 'cuda' asked for but no CUDA device is available; use device=auto or cpu")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def _as_source(obj, where: str):
    if obj is None or hasattr(obj, "take"):
        return obj
    if isinstance(obj, (tuple, list)) and len(obj) == 2:
        x, y = (torch.as_tensor(np.asarray(v)) for v in obj)
        validate_arrays(x, y, where)
        return ArraySource(x.float() if x.is_floating_point() else x, y.long() if not y.is_floating_point() else y)
    if isinstance(obj, torch.utils.data.Dataset):
        return MapSource(obj)
    raise DataError(f"{where}: expected (x, y) arrays, a torch Dataset or an ecotrain Source, got {type(obj).__name__}")


def as_bundle(data, num_classes: Optional[int] = None) -> DataBundle:
    """The user's data: a DataBundle, or a dict/tuple of train/val/test each given as (x, y) or a Dataset."""
    if isinstance(data, DataBundle):
        return data
    parts = data if isinstance(data, Mapping) else dict(zip(("train", "val", "test"), data))
    train = _as_source(parts.get("train"), "train data")
    if train is None:
        raise DataError("data: a train split is required")
    x0, y0 = train.take(torch.tensor([0]))
    if num_classes is None and not torch.is_floating_point(y0):
        num_classes = int(train.labels().max()) + 1
    return DataBundle(train, _as_source(parts.get("val"), "val data"), _as_source(parts.get("test"), "test data"),
                      num_classes, tuple(x0.shape[1:]))


def plan_steps(cfg: Config, steps_per_epoch: int) -> int:
    budgets = [b for b in (cfg.loop.max_steps, cfg.loop.max_epochs and cfg.loop.max_epochs * steps_per_epoch) if b]
    return min(budgets)


def default_callbacks(cfg: Config, run_dir: Path, has_val: bool, quiet: bool, writes: bool = True,
                      eval_samples: int = 0) -> list[Callback]:
    es = cfg.early_stopping
    if es.enabled and not has_val:
        raise ConfigError("early_stopping.enabled: needs a validation split (data.val_split > 0 or val data)")
    cbs: list[Callback] = [DivergenceGuard(cfg.divergence.action, cfg.divergence.max_skips, cfg.divergence.check_every),
                           BestTracker(es.monitor, es.mode, es.min_delta)]
    if es.enabled:
        cbs.append(EarlyStopping(es.patience))
    if cfg.ledger.enabled:  # before the logger and the bar: it adds cost fields to their records
        cbs.append(Ledger(cfg.ledger, cfg.budget, eval_samples))
    if writes:  # under torchrun, rank 0 alone writes the run folder
        cbs.append(MetricsLogger(run_dir / "metrics.jsonl"))
    show = cfg.logging.progress == "on" or (cfg.logging.progress == "auto" and sys.stderr.isatty())
    if show and not quiet:
        cbs.append(ProgressBar())
    return cbs


def config_callbacks(cfg: Config) -> list[Callback]:
    """Callbacks named in the config by import path (`callbacks: [{path: pkg.mod:Class, kwargs: {}}]`)."""
    out = []
    for spec in cfg.callbacks:
        cls = import_object(spec.path, "callbacks.path")
        try:
            cb = cls(**spec.kwargs)
        except TypeError as exc:
            raise ConfigError(f"callbacks: {spec.path}: {exc}") from None
        if not isinstance(cb, Callback):
            raise ConfigError(f"callbacks: {spec.path} is not an ecotrain Callback")
        out.append(cb)
    return out


def save_weights(path: Path, model_or_sd) -> None:
    sd = model_or_sd.state_dict() if isinstance(model_or_sd, nn.Module) else model_or_sd
    atomic_write(path, st_save({k: v.detach().cpu().contiguous().clone() for k, v in sd.items()}))


def versions() -> dict:
    return {"python": platform.python_version(), "torch": torch.__version__, "ecotrain": ecotrain.__version__}


def fit(config: Config, *, model: Optional[nn.Module] = None, data: Any = None,
        loss_fn: Optional[Callable] = None, metrics: Optional[Mapping[str, Callable]] = None,
        callbacks: Sequence[Callback] = (), run_dir: str | Path | None = None, quiet: bool = False,
        resume: str | Path | None = None, allow_config_change: bool = False,
        init_from: str | Path | None = None, keep_optimizer: bool = False) -> RunResult:
    """Train `config` end to end. Pass `model`, `data`, `loss_fn`, `metrics` to use your own parts.

    `resume`: a checkpoint folder to continue from exactly. `init_from`: a checkpoint folder or
    weights file to start a new run from (its optimizer state too with `keep_optimizer`)."""
    cfg = config
    seed_everything(cfg.seed, cfg.deterministic)
    device = resolve_device(cfg.device)
    dist = distributed.setup(cfg, device)
    try:
        return _fit(cfg, dist, device, model, data, loss_fn, metrics, callbacks, run_dir, quiet, resume,
                    allow_config_change, init_from, keep_optimizer)
    except RuntimeError as exc:  # a dead peer or a timed-out collective: one clear line
        err = distributed.collective_error(exc, dist)
        if err is None:
            raise
        raise err from None
    finally:
        dist.shutdown()


def _fit(cfg, dist, device, model, data, loss_fn, metrics, callbacks, run_dir, quiet, resume,
         allow_config_change, init_from, keep_optimizer) -> RunResult:
    bundle = load_data(cfg) if data is None else as_bundle(data)
    task = (UserTask(loss_fn, metrics) if loss_fn else LanguageModelTask() if bundle.extra.get("task") == "lm"
            else ClassificationTask(cfg.loop.label_smoothing))
    torch.manual_seed(cfg.seed)  # model init is independent of how much randomness data loading drew
    net = (model if model is not None else build_model(cfg.model, bundle.input_shape, bundle.num_classes)).to(device)
    configure_memory(net, cfg.memory)  # activation checkpointing, allocator (memory.py)
    net = dist.wrap(net, cfg.distributed)  # DDP wrapper, or FSDP2 sharding in place
    if dist.world_size > 1:
        torch.manual_seed(cfg.seed + 1000 * dist.rank)  # own dropout masks per rank; init was shared

    run_dir = Path(run_dir) if run_dir else default_run_dir(cfg.name)
    run_dir.mkdir(parents=True, exist_ok=True)
    if dist.is_main:
        write_config(run_dir, cfg.to_dict())

    eff_batch = cfg.data.batch_size * cfg.loop.accumulate
    lengths = bundle.extra.get("lengths")  # variable-length sequences only
    sampler = build_sampler(len(bundle.train), lengths, eff_batch, cfg.seed, cfg.data.bucketing)
    if dist.world_size > 1:
        sampler = distributed.ShardedSampler(sampler, dist.rank, dist.world_size)
    total = plan_steps(cfg, len(sampler))
    opt = build_optimizer(net, cfg.optim)
    sched_total = total if cfg.schedule.interval == "step" else -(-total // len(sampler))
    state = TrainState(cfg, net, opt, build_scheduler(opt, cfg.schedule, sched_total), task,
                       Precision(cfg.precision, device), device, len(sampler), total, run_dir, dist)
    state.extra["world_size"] = dist.world_size
    if lengths is not None:
        state.extra["padding_ratio"] = round(padding_ratio(sampler.batches(0), lengths), 4)  # epoch 0's batches
    augment = SignalAugment(cfg.data.augment, cfg.seed)
    if init_from is not None:
        resume_mod.init_from(net, opt, Path(init_from), keep_optimizer)
    cb_list = [*default_callbacks(cfg, run_dir, bundle.val is not None, quiet or not dist.is_main, dist.is_main,
                                 len(bundle.val) if bundle.val is not None else 0),
               *config_callbacks(cfg), *callbacks]
    logger = next((cb for cb in cb_list if isinstance(cb, MetricsLogger)), None)  # rank 0 only
    preemption = Preemption()
    manager = CheckpointManager(run_dir, cfg.checkpoint.keep_last, cfg.checkpoint.background)
    offset = logger.offset if logger else (lambda: 0)
    cb_list.append(Checkpointer(manager, cfg.checkpoint, lambda st, copy: capture(
        st, cbs, augment, offset(), bundle.content_hash, copy), preemption))
    cbs = CallbackList(cb_list)  # the Checkpointer last: it saves what every other callback did this step
    if resume is not None:
        whole = resume_mod.resume_into(state, cbs, augment, Path(resume), bundle.content_hash, allow_config_change)
        if logger:
            resume_mod.truncate_metrics(logger.path, whole["metrics_offset"])

    def evaluate_fn(st: TrainState) -> dict:
        record = {"step": st.step, "epoch": st.epoch}
        if bundle.val is not None:
            record.update(evaluate_split(st, bundle.val, "val"))
        st.last_eval = record
        return record

    preemption.install()
    try:
        loop.train(state, sampler, bundle.train, cbs, augment, evaluate_fn)
    except BaseException as exc:
        cbs.on_exception(state, exc)
        raise
    finally:
        preemption.uninstall()
    if state.stopped_because == "preempted":  # not finished: no test, no final weights; resume later
        summary = {"stopped_because": "preempted", "steps": state.step, "checkpoint": state.extra.get("last_checkpoint")}
        if dist.is_main:
            write_ledger(run_dir, state.extra.pop("ledger", None))  # this segment's cost so far
        return RunResult(run_dir, summary, net, state)
    if state.precision.scaler:
        state.extra["fp16_skipped_steps"] = state.precision.skipped_steps
    summary = finish(state, bundle, run_dir)
    return RunResult(run_dir, summary, net, state)


def evaluate_split(state: TrainState, source, prefix: str) -> dict:
    """`loop.evaluate` on this rank's view of `source` (its shard under DDP), reduced across ranks."""
    model, src, reduce_with = state.dist.eval_view(state.model, source)
    return loop.evaluate(model, src, state.task, state.config.data.batch_size * 4, state.device, state.precision,
                         prefix, reduce_with)


def finish(state: TrainState, bundle: DataBundle, run_dir: Path) -> dict:
    """Test once on the best weights, measure the train/val gap, write weights and summary.json."""
    cfg, net, dev, dist = state.config, state.model, state.device, state.dist
    if state.best_weights is not None and (cfg.early_stopping.restore_best or not cfg.early_stopping.enabled):
        net.load_state_dict(state.best_weights)
    weights = dist.full_state_dict(net)  # a collective under FSDP: every rank takes part
    if dist.is_main:
        save_weights(run_dir / "model.safetensors", weights)
    ledger = state.extra.pop("ledger", None)  # ledger.json, not summary.json
    summary: dict[str, Any] = {
        "name": cfg.name, "steps": state.step, "epochs": state.epoch, "samples_seen": state.samples_seen,
        "stopped_because": state.stopped_because, "train_seconds": round(state.train_seconds, 4),
        "steps_per_second": round(state.step / state.train_seconds, 2) if state.train_seconds else None,
        "best_val_metric": state.best_metric, "best_step": state.best_step,
        "monitor": cfg.early_stopping.monitor, "dataset_hash": bundle.content_hash, "versions": versions(),
        "device": str(dev), **state.extra,
    }
    n_gap = min(len(bundle.train), 5000)  # enough to measure the gap without a full pass on big data
    train_m = evaluate_split(state, _head(bundle.train, n_gap), "train")
    summary.update(train_m)
    if bundle.val is not None:
        val_m = evaluate_split(state, bundle.val, "val")
        summary.update(val_m)
        key = "accuracy" if "train_accuracy" in train_m else "loss"
        summary["train_val_gap"] = round(train_m[f"train_{key}"] - val_m[f"val_{key}"], 6)
    if bundle.test is not None:
        summary.update(evaluate_split(state, bundle.test, "test"))
    if dist.is_main:
        write_json(run_dir / "summary.json", summary)
        write_ledger(run_dir, ledger)
    return summary


def _head(source, n: int):
    from ecotrain.data import subset

    return source if len(source) <= n else subset(source, torch.arange(n))
