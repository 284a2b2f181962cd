"""Assembling a run: data, methods, model, optimizer, state, callbacks and the run folder, from a
Config and the user's own parts. Nothing is written to the run folder here: `RunFolder.accept`
does that once everything (a resume included) has been checked, so a refused start leaves no trace.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np
import torch
from torch import nn

from ecotrain import resume as resume_mod
from ecotrain.callbacks import (BestTracker, Callback, CallbackList, Checkpointer, DivergenceGuard, EarlyStopping,
                                MetricsLogger, ProgressBar)
from ecotrain.checkpoint.manager import CheckpointManager
from ecotrain.preemption import Preemption
from ecotrain.checkpoint.state import capture
from ecotrain.config import Config
from ecotrain.data import ArraySource, DataBundle, MapSource, load_data
from ecotrain.data.augment import SignalAugment
from ecotrain.data.bucketing import build_sampler, padding_ratio
from ecotrain.data.builtin import import_object, validate_arrays
from ecotrain.errors import ConfigError, DataError
from ecotrain.methods import Method, Methods, build_methods
from ecotrain.memory import configure_memory
from ecotrain.models import build_model
from ecotrain.objective import Objective
from ecotrain.optim import build_optimizer, build_scheduler
from ecotrain.precision import Precision
from ecotrain.rundir import RunFolder
from ecotrain.state import TrainState
from ecotrain.tracking import tracking_callbacks
from ecotrain.task import ClassificationTask, LanguageModelTask, UserTask


@dataclass
class UserParts:
    """What a Python API user may bring instead of the config's built-ins."""

    model: Optional[nn.Module] = None
    data: Any = None
    loss_fn: Optional[Callable] = None
    metrics: Optional[Mapping[str, Callable]] = None
    callbacks: Sequence[Callback] = ()
    methods: Sequence[Method] = ()


@dataclass
class RunOptions:
    run_dir: Optional[Path] = None
    quiet: bool = False
    resume: Optional[Path] = None
    allow_config_change: bool = False
    init_from: Optional[Path] = None
    keep_optimizer: bool = False
    overwrite: bool = False


@dataclass
class Run:
    """An assembled run: what the loop needs and what `finish` reads afterwards."""

    state: TrainState
    bundle: DataBundle
    source: Any  # the train source the loop reads (after the methods' `data` hook)
    sampler: Any
    cbs: CallbackList
    augment: SignalAugment
    folder: RunFolder
    ledger: Any = None  # accounting.Ledger, when on
    metrics_offset: Optional[int] = None  # a resume truncates metrics.jsonl here once accepted
    facts: dict = field(default_factory=dict)  # run facts for summary.json (padding_ratio)


def assemble(cfg: Config, dist, device, parts: UserParts, opts: RunOptions, preemption: Preemption) -> Run:
    folder = RunFolder.plan(opts.run_dir, cfg.name, dist, opts.resume is not None, opts.overwrite)
    bundle = load_data(cfg) if parts.data is None else as_bundle(parts.data)
    methods = build_methods(cfg, parts.methods)
    task = (UserTask(parts.loss_fn, parts.metrics) if parts.loss_fn else
            LanguageModelTask() if bundle.extra.get("task") == "lm" else ClassificationTask(cfg.loop.label_smoothing))
    net, sharded_init = make_model(cfg, parts.model, bundle, device, methods, dist, opts)
    source, sampler, facts = make_sampler(cfg, bundle, dist, methods)
    total = plan_steps(cfg, len(sampler))
    opt = build_optimizer(net, cfg.optim, methods.param_groups(dist.unwrap(net)))
    sched_total = total if cfg.schedule.interval == "step" else -(-total // len(sampler))
    state = TrainState(cfg, net, opt, build_scheduler(opt, cfg.schedule, sched_total), Objective(task, methods),
                       Precision(cfg.precision, device), device, len(sampler), total, folder.path, dist, methods)
    augment = SignalAugment(cfg.data.augment, cfg.seed)
    if opts.init_from is not None:  # the optimizer's state (--keep-optimizer), or an FSDP checkpoint's shards
        resume_mod.init_from(net, opt, sharded_init or Path(opts.init_from), opts.keep_optimizer)
    cbs, logger, ledger = make_callbacks(cfg, state, bundle, folder, parts, opts, methods, augment, preemption)
    run = Run(state, bundle, source, sampler, cbs, augment, folder, ledger, facts=facts)
    if opts.resume is not None:  # checked and loaded in memory; the folder is untouched until accepted
        whole = resume_mod.resume_into(state, cbs, augment, Path(opts.resume), bundle.content_hash,
                                       opts.allow_config_change)
        run.metrics_offset = whole["metrics_offset"] if logger else None
    return run


def make_model(cfg: Config, model: Optional[nn.Module], bundle: DataBundle, device, methods: Methods, dist,
               opts: RunOptions):
    """(the model, ready to train; an FSDP checkpoint still to load after the wrap, or None)."""
    torch.manual_seed(cfg.seed)  # model init is independent of how much randomness data loading drew
    net = (model if model is not None else build_model(cfg.model, bundle.input_shape, bundle.num_classes)).to(device)
    sharded_init = None
    if opts.init_from is not None:  # the starting weights, before a method changes the model (BN -> GN, adapters)
        sharded_init = resume_mod.init_from(net, None, Path(opts.init_from), opts.keep_optimizer)
        if sharded_init is not None and methods.transforms:
            raise ConfigError(f"--init-from {opts.init_from}: a sharded (FSDP) checkpoint cannot be combined with "
                              "methods that change the model; start from its model.safetensors instead")
    configure_memory(net, cfg.memory)  # activation checkpointing, allocator (memory.py)
    net = methods.transform(net)  # before the optimizer and the wrap; on resumed runs too
    net = dist.wrap(net, cfg.distributed)  # DDP wrapper, or FSDP2 sharding in place
    if dist.world_size > 1:
        torch.manual_seed(cfg.seed + 1000 * dist.rank)  # own dropout masks per rank; init was shared
    return net, sharded_init


def make_sampler(cfg: Config, bundle: DataBundle, dist, methods: Methods):
    """(train source, sampler, facts): the seeded order of effective batches, this rank's share."""
    from ecotrain import distributed

    lengths = bundle.extra.get("lengths")  # variable-length sequences only
    sampler = build_sampler(len(bundle.train), lengths, cfg.data.batch_size * cfg.loop.accumulate, cfg.seed,
                            cfg.data.bucketing, bundle.extra.get("blocks"), cfg.data.shuffle_window)
    facts = {}
    if lengths is not None:
        facts["padding_ratio"] = round(padding_ratio(sampler.batches(0), lengths), 4)  # epoch 0's batches
    source, sampler = methods.data(bundle.train, sampler)
    if dist.world_size > 1:
        sampler = distributed.ShardedSampler(sampler, dist.rank, dist.world_size)
    return source, sampler, facts


def plan_steps(cfg: Config, steps_per_epoch: int) -> int:
    budgets = [b for b in (cfg.loop.max_steps, cfg.loop.max_epochs and cfg.loop.max_epochs * steps_per_epoch) if b]
    return min(budgets)


def make_callbacks(cfg, state, bundle, folder, parts, opts, methods, augment, preemption):
    """The callback list, the Checkpointer last: it saves what every other callback did this step."""
    from ecotrain.accounting import Ledger

    dist = state.dist
    es = cfg.early_stopping
    if es.enabled and bundle.val is None:
        raise ConfigError("early_stopping.enabled: needs a validation split (data.val_split > 0 or val data)")
    from ecotrain.callbacks.divergence import roll_back

    guard = DivergenceGuard.from_config(cfg.divergence, dist.world_size,  # rollback: the run's own resume code
                                        rollback=lambda st: roll_back(st, cb_list, augment, manager))
    cbs: list[Callback] = [guard, BestTracker(es.monitor, es.mode, es.min_delta)]
    if es.enabled:
        cbs.append(EarlyStopping(es.patience))
    ledger = None
    if cfg.ledger.enabled:  # before the logger and the bar: it adds cost fields to their records
        ledger = Ledger(cfg.ledger, cfg.budget, len(bundle.val) if bundle.val is not None else 0)
        cbs.append(ledger)
    logger = MetricsLogger(folder.path / "metrics.jsonl") if dist.is_main else None  # rank 0 writes files
    if logger:
        cbs.append(logger)
    show = cfg.logging.progress == "on" or (cfg.logging.progress == "auto" and sys.stderr.isatty())
    if show and not opts.quiet and dist.is_main:
        cbs.append(ProgressBar())
    cbs += [*config_callbacks(cfg), *methods.callbacks(), *parts.callbacks]
    cbs += tracking_callbacks(cfg, folder)  # MLflow, TensorBoard (tracking/): when configured, rank 0
    manager = CheckpointManager(folder.path, cfg.checkpoint.keep_last, cfg.checkpoint.background)
    offset = logger.offset if logger else (lambda: 0)
    cbs.append(Checkpointer(manager, cfg.checkpoint, lambda st, copy: capture(
        st, cb_list, augment, offset(), bundle.content_hash, copy), preemption))
    cb_list = CallbackList(cbs)
    cb_list.stateful()  # two callbacks sharing a state key fail here, before anything trains
    return cb_list, logger, ledger


def config_callbacks(cfg: Config) -> list[Callback]:
    """Callbacks named in the config by import path (`callbacks: [{path: pkg.mod:Class, kwargs: {}}]`)."""
    out = []
    for spec in cfg.callbacks:
        cls = import_object(spec.path, "callbacks.path")
        try:
            cb = cls(**spec.kwargs)
        except TypeError as exc:
            raise ConfigError(f"callbacks: {spec.path}: {exc}") from None
        except Exception as exc:  # the user's class raised while being built
            raise ConfigError(f"callbacks: building '{spec.path}' raised {type(exc).__name__}: {exc}") from None
        if not isinstance(cb, Callback):
            raise ConfigError(f"callbacks: {spec.path} is not an ecotrain Callback")
        out.append(cb)
    return out


def evaluate_split(state: TrainState, source, prefix: str, final: bool = False) -> dict:
    """`loop.evaluate` on this rank's view of `source` (its shard under DDP), reduced across ranks.
    During training it evaluates `methods.eval_model` (EMA's average); `final`: the model itself,
    which `finish` has loaded with the final weights."""
    from ecotrain import loop

    model, src, reduce_with = state.dist.eval_view(state.model, source)
    if state.methods and not final:
        model = state.methods.eval_model(model)
    return loop.evaluate(model, src, state.task, state.config.data.batch_size * 4, state.device, state.precision,
                         prefix, reduce_with)


def make_evaluate(bundle: DataBundle):
    def evaluate_fn(state: TrainState) -> dict:
        record = {"step": state.step, "epoch": state.epoch}
        if bundle.val is not None:
            record.update(evaluate_split(state, bundle.val, "val"))
        state.last_eval = record
        return record
    return evaluate_fn


# -- the user's data, as given to the Python API ------------------------------------------------
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
