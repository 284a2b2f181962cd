"""Assembling a run: data, methods, model, optimizer, state, callbacks and the run folder, from a
Config and the user's own parts. Nothing is written to the run folder here: `RunFolder.accept`
does that once everything (a resume included) has been checked, so a refused start leaves no trace.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np
import torch
from torch import nn

from ecotrain.core import distributed, resume as resume_mod
from ecotrain.callbacks import (BestTracker, Callback, CallbackList, Checkpointer, DivergenceGuard, EarlyStopping,
                                MetricsLogger, ProgressBar, ProgressLog)
from ecotrain.callbacks.divergence import roll_back
from ecotrain.callbacks.wing import Wing, WingContext
from ecotrain.checkpoint.manager import CheckpointManager
from ecotrain.core.preemption import Preemption
from ecotrain.checkpoint.snapshot import capture
from ecotrain.config import Config
from ecotrain.core.batch import describe as describe_batch, leaves
from ecotrain.data import ArraySource, DataBundle, MapSource, load_data
from ecotrain.data.sources import LoaderSource, distributed_sampler
from ecotrain.data.augment import SignalAugment
from ecotrain.data.bucketing import build_sampler, padding_ratio
from ecotrain.base.objects import describe, import_object
from ecotrain.data.builtin import validate_arrays
from ecotrain.base.errors import ConfigError, DataError, EcotrainError
from ecotrain.base.log import log
from ecotrain.methods import Method, Methods, build_methods
from ecotrain.methods.base import overrides
from ecotrain.core.chunked_loss import check_task as check_chunked_loss
from ecotrain.core.levers import configure_memory, oom_hint
from ecotrain.memory.measure import for_run as memory_plan_for_run
from ecotrain.core.optim_offload import offload_optimizer_state
from ecotrain.models import build_model
from ecotrain.core.objective import Objective
from ecotrain.core.optim import build_optimizer, build_scheduler, refuse_user_scheduler
from ecotrain.core.precision import Precision
from ecotrain.base.rundir import RunFolder
from ecotrain.base.runfiles import MODEL, RunFiles
from ecotrain.core.state import TrainState
from ecotrain.core.stepplan import StepPlan, step_batch_size
from ecotrain.assembly.wings import read_ledger  # the accounting wing's reader, reached through the one place wings plug in
from ecotrain.core.task import UserTask, build_task, user_metrics
from ecotrain.core.threads import ThreadChoice


@dataclass
class UserParts:
    """What a Python API user may bring instead of the config's built-ins."""

    model: Optional[nn.Module] = None
    data: Any = None
    loss_fn: Optional[Callable] = None
    metrics: Optional[Mapping[str, Callable]] = None
    callbacks: Sequence[Callback] = ()
    methods: Sequence[Method] = ()
    task: Any = None  # a Task object (task.py); None: from the config and the data
    optimizer: Optional[Callable] = None  # param groups -> torch.optim.Optimizer
    scheduler: Optional[Callable] = None  # optimizer -> an LR scheduler (stepped per schedule.interval)


@dataclass
class RunOptions:
    run_dir: Optional[Path] = None
    quiet: bool = False
    resume: Optional[Path] = None
    allow_config_change: bool = False
    init_from: Optional[Path] = None
    keep_optimizer: bool = False
    overwrite: bool = False
    threads: Optional[ThreadChoice] = None  # torch's thread count for this call and why (fit sets it)


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
    metrics_offset: Optional[int] = None  # a resume truncates metrics.jsonl here once accepted
    facts: dict = field(default_factory=dict)  # run facts for summary.json (padding_ratio)
    threads: Optional[ThreadChoice] = None  # recorded in environment.json
    memory_plan: Optional[dict] = None  # memory.budget's choice and measurements (memory/planner.py): memory_plan.json


def assemble(cfg: Config, dist, device, parts: UserParts, opts: RunOptions, preemption: Preemption,
             wings: Sequence[Wing] = ()) -> Run:
    """`wings`: what adds its callbacks beside the core's (ecotrain/assembly/wings.py: the ledger, trackers)."""
    folder = RunFolder.plan(opts.run_dir, cfg.name, dist, opts.resume is not None, opts.overwrite)
    # memory.budget: the fastest measured plan that fits, applied to the config (a resume reads it back)
    cfg, memory_plan = memory_plan_for_run(cfg, folder.path, opts.resume, own_parts(parts), dist)
    dist.strategy = cfg.distributed.strategy  # under torchrun the plan may shard (memory/shard.py); nothing is wrapped yet
    if parts.data is None and parts.model is not None and "name" not in cfg.data.model_fields_set:
        raise DataError("fit(model=...) without data=: pass your data (arrays, a Dataset, a DataLoader or "
                        "{'train': ..., 'val': ...}), or set data.name to train on a built-in dataset")
    bundle = load_data(cfg) if parts.data is None else as_bundle(parts.data, fingerprint=cfg.data.fingerprint,
                                                                 batch_size=cfg.data.batch_size, dist=dist)
    methods = build_methods(cfg, parts.methods, load_trained, read_ledger)  # a teacher or reference run: rebuilt by inference
    task = make_task(cfg, parts, bundle)
    check_methods_fit(methods, task, bundle, started_from=opts.init_from or opts.resume)
    if cfg.memory.chunked_loss == "on":
        check_chunked_loss(task, methods)
    net, sharded_init = make_model(cfg, parts.model, bundle, device, methods, dist, opts)
    source, sampler, facts = make_sampler(cfg, bundle, dist, methods)
    facts["tokens_per_sample"] = tokens_per_sample(bundle, task)
    total = plan_steps(cfg, len(sampler))
    opt = build_optimizer(net, cfg.optim, methods.param_groups(dist.unwrap(net)), factory=parts.optimizer)
    if cfg.memory.optimizer_offload == "on":  # the state out of memory between steps (core/optim_offload.py)
        offload_optimizer_state(opt, cfg.memory.offload_dir or folder.path, device, dist.strategy)
    sched_total = total if cfg.schedule.interval == "step" else -(-total // max(1, len(sampler)))
    sched = parts.scheduler(opt) if parts.scheduler else build_scheduler(opt, cfg.schedule, sched_total)
    refuse_user_scheduler(sched, [f"methods.{m.key}" for m in methods.methods if "schedule" in getattr(m, "needs", ())]
                          + (["divergence.action=rollback"] if cfg.divergence.action == "rollback" else []))
    state = TrainState(cfg, net, opt, sched, Objective(task, methods),
                       Precision(cfg.precision, device), device, len(sampler), total, folder.path, dist, methods,
                       data_source=source if isinstance(source, LoaderSource) else None)
    augment = SignalAugment(cfg.data.augment, cfg.seed, dist.rank, dist.world_size)
    if augment.active and not isinstance(source, ArraySource):
        raise ConfigError("data.augment: works on in-memory (x, y) signal arrays only; augment inside your "
                          "Dataset's __getitem__ instead (it is seeded per item)")
    if opts.init_from is not None:  # the optimizer's state (--keep-optimizer), or an FSDP checkpoint's shards
        resume_mod.init_from(net, opt, sharded_init or Path(opts.init_from), opts.keep_optimizer)
    cbs, logger = make_callbacks(cfg, state, bundle, folder, parts, opts, methods, augment, preemption, wings,
                                 facts["tokens_per_sample"])
    run = Run(state, bundle, source, sampler, cbs, augment, folder, facts=facts, threads=opts.threads,
              memory_plan=memory_plan.record(state.plan.step_batch) if memory_plan else None)
    derived = distributed.micro_batches_for(cfg, dist.world_size)
    if derived is not None and memory_plan is not None:
        raise ConfigError("loop.micro_batch_size and memory.budget both choose the micro-batches; set one of them")
    saved = None
    if opts.resume is not None:  # checked and loaded in memory; the folder is untouched until accepted
        whole = resume_mod.resume_into(state, cbs, augment, Path(opts.resume), bundle.content_hash,
                                       opts.allow_config_change)
        saved = whole.get("counters", {}).get("micro_batches")  # a count OOM recovery raised (stepplan.py)
        run.metrics_offset = whole["metrics_offset"] if logger else None
        redone = resume_mod.steps_past(RunFiles(folder.path).metrics, run.metrics_offset, state.step)
        state.counters.resumes += 1
        state.counters.steps_redone += redone
        if redone:
            log.info(f"the interrupted run trained {redone} steps past step {state.step}: they are trained again")
    hint = oom_hint(folder.path) if opts.resume is not None else None
    planned = memory_plan.chosen.candidate.micro_batches if memory_plan is not None else None
    state.plan = StepPlan.resolve(cfg, planned, saved, derived, hint)  # the one place the cut is settled
    if hint is not None and state.plan.micro_batches == hint and hint > (derived or saved or planned or cfg.loop.accumulate):
        log.warning(f"a rank ran out of memory before this restart: every rank continues with {hint} micro-batches")
        state.counters.oom_recoveries += 1  # every rank reads the same file: the same count on all
    return run


def load_trained(*args, **kwargs):
    """inference.load_trained, imported when a method asks for a trained run (distill's teacher, the
    curriculum's reference): inference and the methods it rebuilds are not a plain run's start-up."""
    from ecotrain.export.inference import load_trained as load  # here: ~10 ms of imports a plain run never needs

    return load(*args, **kwargs)


def own_parts(parts: UserParts) -> list[str]:
    """The user's own objects that change what a step computes (a fresh process cannot rebuild them)."""
    names = ("model", "data", "loss_fn", "task", "optimizer", "scheduler", "methods")
    return [n for n in names if getattr(parts, n) not in (None, (), [])]


def make_task(cfg: Config, parts: UserParts, bundle: DataBundle):
    """The user's Task object, a user loss function, or the one the config names (auto: from the data)."""
    if parts.task is not None:
        missing = [a for a in ("forward", "loss", "units") if not callable(getattr(parts.task, a, None))]
        if missing:
            raise ConfigError(f"fit(task=...): {type(parts.task).__name__} has no {', '.join(missing)}; a Task "
                              "has forward(model, batch), loss(outputs, batch, reduction), units(batch), metrics()")
        return parts.task
    if parts.loss_fn is not None:
        return UserTask(parts.loss_fn, parts.metrics, cfg.task.target)
    task = build_task(cfg, bundle.sample, lm=bundle.extra.get("task") == "lm", num_classes=None,
                      bytes_per_token=bundle.extra.get("bytes_per_token"))
    if parts.metrics:  # metrics beside a built-in task's own
        own = task.metrics

        def metrics():
            return {**own(), **user_metrics(parts.metrics)}
        task.metrics = metrics
    return task


def tokens_per_sample(bundle: DataBundle, task) -> Optional[float]:
    """Tokens a training sample holds, for a language model's figures (tokens/s, FLOPs and cost per
    token): what the data says (`extra["tokens_per_sample"]`: padded sequences' mean real length),
    else the length of fixed-length token ids `[T]`; None for other tasks."""
    if getattr(task, "name", None) != "language_model":
        return None
    given = bundle.extra.get("tokens_per_sample")
    if given is not None:
        return float(given)
    return float(bundle.input_shape[0]) if len(bundle.input_shape) == 1 else None


def check_methods_fit(methods: Methods, task, bundle: DataBundle, started_from=None) -> None:
    """One line for a method that cannot work with this task or data, before anything trains.
    `started_from`: init_from, or the checkpoint a resume restores (which holds what "init" needs)."""
    for m in methods.methods:
        needs = getattr(m, "needs", ())
        if "init" in needs and started_from is None:
            raise ConfigError(f"methods: '{m.key}' needs the weights the run starts from (fit's init_from, "
                              "--init-from: the deployed model) and this run starts from none")
        if "val" in needs and bundle.val is None:
            raise ConfigError(f"methods: '{m.key}' chooses on the validation split and this run has none; set "
                              "data.val_split or pass a 'val' split")
        if "xy" in needs and task.name not in ("classification", "language_model", "sequence", "user"):
            raise ConfigError(f"methods: '{m.key}' needs (x, y) batches of a classification task; this run's task "
                              f"is '{task.name}' (set task.name, or drop the method)")
        dicts = getattr(m, "dicts", False) and isinstance(bundle.sample, Mapping)  # token dicts (replay, lwf)
        if "xy" in needs and bundle.sample is not None and not _is_xy(bundle.sample) and not dicts:
            raise ConfigError(f"methods: '{m.key}' needs (x, y) tensor batches; this data's batches are "
                              f"{describe_batch(bundle.sample)}")
        if isinstance(bundle.train, LoaderSource) and overrides(m, "data"):
            raise ConfigError(f"methods: '{m.key}' chooses which samples train, so it needs indexable data "
                              "(arrays or a map-style Dataset), not a DataLoader or a stream")


def _is_xy(batch) -> bool:
    return isinstance(batch, (tuple, list)) and len(batch) == 2 and all(isinstance(t, torch.Tensor) for t in batch)


def make_model(cfg: Config, model: Optional[nn.Module], bundle: DataBundle, device, methods: Methods, dist,
               opts: RunOptions):
    """(the model, ready to train; an FSDP checkpoint still to load after the wrap, or None)."""
    torch.manual_seed(cfg.seed)  # model init is independent of how much randomness data loading drew
    builtin = model is None and ":" not in cfg.model.name  # a user's class by import path sizes itself: no labels read
    if builtin and bundle.num_classes is None and bundle.sample is not None:
        y0 = bundle.sample[1] if _is_xy(bundle.sample) else None
        if y0 is None or y0.is_floating_point() or y0.ndim != 1:
            raise ConfigError("model: the built-in models are classifiers of (x, y) data with class labels; pass "
                              "your own model (fit(model=...) or model.name: pkg.module:Class)")
        bundle.num_classes = int(bundle.train.labels().max()) + 1  # the head's size: the one feature that reads labels
    net = (model if model is not None else build_model(cfg.model, bundle.input_shape, bundle.num_classes)).to(device)
    sharded_init = None
    if opts.init_from is not None:  # the starting weights, before a method changes the model (BN -> GN, adapters)
        sharded_init = resume_mod.init_from(net, None, Path(opts.init_from), opts.keep_optimizer)
        if sharded_init is not None and methods.transforms:
            raise ConfigError(f"--init-from {opts.init_from}: a sharded (FSDP) checkpoint cannot be combined with "
                              f"methods that change the model; start from its {MODEL} instead")
    configure_memory(net, cfg.memory)  # activation checkpointing, allocator (core/levers.py)
    net = methods.transform(net)  # before the optimizer and the wrap; on resumed runs too
    net = dist.wrap(net, cfg.distributed)  # DDP wrapper, or FSDP2 sharding in place
    if cfg.compile:  # in place: the module's keys stay its own (no `_orig_mod.` prefix reaches a checkpoint)
        net.compile()
    if dist.world_size > 1:
        torch.manual_seed(cfg.seed + 1000 * dist.rank)  # own dropout masks per rank; init was shared
    return net, sharded_init


def make_sampler(cfg: Config, bundle: DataBundle, dist, methods: Methods):
    """(train source, sampler, facts): the seeded order of effective batches, this rank's share."""
    if isinstance(bundle.train, LoaderSource):  # the user's loader decides the order; ecotrain counts steps
        check_loader_shares(bundle.train, dist)
        bundle.train.seed(cfg.seed)
        return bundle.train, LoaderSteps(bundle.train, cfg), {}
    lengths = bundle.extra.get("lengths")  # variable-length sequences only
    sampler = build_sampler(len(bundle.train), lengths, step_batch_size(cfg), cfg.seed,
                            cfg.data.bucketing, bundle.extra.get("blocks"), cfg.data.shuffle_window)
    facts = {}
    if lengths is not None:
        facts["padding_ratio"] = round(padding_ratio(sampler.batches(0), lengths), 4)  # epoch 0's batches
    source, sampler = methods.data(bundle.train, sampler)
    if cfg.distributed.strategy != "none":  # at any world size (1 too): a resize keeps the same batches
        sampler = distributed.ShardedSampler(sampler, dist.rank, dist.world_size)
    return source, sampler, facts


def check_loader_shares(source, dist) -> None:
    """A user's DataLoader under torchrun must give each rank its own share: a DistributedSampler for
    this world size and rank (ecotrain calls its set_epoch each epoch); else one line with the fix."""
    if dist.world_size == 1:
        return
    loader = source.loader
    if getattr(source, "rank_sharded", False):  # a `datasets` stream ecotrain split per rank
        return
    ds = distributed_sampler(loader)
    if ds is None and isinstance(getattr(loader, "dataset", None), torch.utils.data.IterableDataset):
        raise ConfigError(f"data: under torchrun ({dist.world_size} ranks) ecotrain cannot tell whether this "
                          "IterableDataset gives each rank its own share; pass a Hugging Face datasets stream "
                          "(ecotrain splits it per rank), tar or Parquet shards (data.name: shards:PATTERN), or a "
                          "map-style Dataset")
    if ds is None:
        raise ConfigError(f"data: under torchrun ({dist.world_size} ranks) every rank would read the whole DataLoader, "
                          "so each sample would be trained on once per rank; build it with sampler=torch.utils.data."
                          "DistributedSampler(dataset, num_replicas=int(os.environ['WORLD_SIZE']), "
                          "rank=int(os.environ['RANK'])) (ecotrain calls set_epoch), or pass the Dataset itself "
                          "(ecotrain shards it per rank)")
    if (ds.num_replicas, ds.rank) != (dist.world_size, dist.rank):
        raise ConfigError(f"data: the DataLoader's DistributedSampler is for {ds.num_replicas} replicas, rank "
                          f"{ds.rank}, but this is rank {dist.rank} of {dist.world_size}; build it in the torchrun "
                          "program with num_replicas=int(os.environ['WORLD_SIZE']), rank=int(os.environ['RANK'])")


class LoaderSteps:
    """The sampler of a user's loader: only its length, steps per pass (0 when the stream's is unknown)."""

    def __init__(self, source: LoaderSource, cfg: Config):
        n = source.batches_per_epoch()
        if n is None and not cfg.loop.max_steps:
            raise ConfigError("loop.max_steps: this data has no length (an IterableDataset), so a step budget "
                              "cannot come from loop.max_epochs; set loop.max_steps")
        self.n = 0 if n is None else -(-n // cfg.loop.accumulate)

    def __len__(self) -> int:
        return self.n


def plan_steps(cfg: Config, steps_per_epoch: int) -> int:
    budgets = [b for b in (cfg.loop.max_steps, cfg.loop.max_epochs and cfg.loop.max_epochs * steps_per_epoch) if b]
    return min(budgets)


def make_callbacks(cfg, state, bundle, folder, parts, opts, methods, augment, preemption, wings=(),
                   tokens_per_sample: Optional[float] = None):
    """The core's callbacks, then each wing's; the order they run in is what they declare (`after`,
    `before`: the Checkpointer after all the others), resolved once by CallbackList."""
    dist = state.dist
    es = cfg.early_stopping
    if es.enabled and bundle.val is None:
        raise ConfigError("early_stopping.enabled: needs a validation split (data.val_split > 0 or val data)")
    guard = DivergenceGuard.from_config(cfg.divergence, dist.world_size,  # rollback: the run's own resume code
                                        rollback=lambda st: roll_back(st, cb_list, augment, manager))
    cbs: list[Callback] = [guard, BestTracker(es.monitor, es.mode, es.min_delta)]
    if es.enabled:
        cbs.append(EarlyStopping(es.patience))
    logger = MetricsLogger(RunFiles(folder.path).metrics) if dist.is_main else None  # rank 0 writes files
    if logger:
        cbs.append(logger)
    bar = cfg.logging.progress == "on" or (cfg.logging.progress == "auto" and sys.stderr.isatty())
    if not opts.quiet and dist.is_main and cfg.logging.progress != "off":  # no terminal: a log line now and then
        cbs.append(ProgressBar() if bar else ProgressLog(cfg.logging.progress_seconds))
    cbs += [*config_callbacks(cfg), *methods.callbacks(), *parts.callbacks]
    manager = CheckpointManager(folder.path, cfg.checkpoint.keep_last, cfg.checkpoint.background)
    offset = logger.offset if logger else (lambda: 0)
    checkpointer = Checkpointer(manager, cfg.checkpoint, lambda st, copy: capture(
        st, cb_list, augment, offset(), bundle.content_hash, copy), preemption)
    cbs.append(checkpointer)
    ctx = WingContext(cfg, state, folder.path, dist.is_main, len(bundle.val) if bundle.val is not None else 0,
                      checkpointer, preemption, tokens_per_sample)
    for wing in wings:  # the ledger, contention watch, carbon timing, trackers (wings.py)
        cbs += wing(ctx)
    cb_list = CallbackList(cbs)
    cb_list.stateful()  # two callbacks sharing a state key fail here, before anything trains
    return cb_list, logger


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


# -- the user's data, as given to the Python API ------------------------------------------------
def _as_source(obj, where: str, batch_size: int, dist=None):
    # batched by ecotrain: data.batch_size, default collate (before `take`: a `datasets` stream has one)
    if isinstance(obj, torch.utils.data.IterableDataset):
        obj, split = _rank_share(obj, dist)  # split: each rank batches its share of the global batch
        source = LoaderSource(_stream_loader(obj, batch_size // dist.world_size if split else batch_size))
        source.rank_sharded = split
        return source
    if obj is None or hasattr(obj, "take"):
        return obj
    if isinstance(obj, torch.utils.data.DataLoader) or _looks_like_loader(obj):
        return LoaderSource(obj)
    if isinstance(obj, (tuple, list)) and len(obj) == 2 and not isinstance(obj[0], (dict, tuple, list)):
        x, y = (torch.as_tensor(np.asarray(v)) for v in obj)
        validate_arrays(x, y, where, labels=not y.is_floating_point())
        return ArraySource(x.float() if x.is_floating_point() else x, y.long() if not y.is_floating_point() else y.float())
    if isinstance(obj, torch.utils.data.Dataset) or (hasattr(obj, "__getitem__") and hasattr(obj, "__len__")
                                                      and not isinstance(obj, (str, bytes, Mapping, tuple, list))):
        return MapSource(obj)
    raise DataError(f"{where}: expected (x, y) arrays, a map-style Dataset, an IterableDataset, a DataLoader or an "
                    f"ecotrain Source, got {type(obj).__name__}")


def _looks_like_loader(obj) -> bool:
    """A loader that is not a torch DataLoader subclass (torchdata's StatefulDataLoader is one; others
    duck-type it): iterable, with a `dataset`, not indexable."""
    return hasattr(obj, "__iter__") and hasattr(obj, "dataset") and not hasattr(obj, "__getitem__")


def _rank_share(ds, dist):
    """(this rank's part of a Hugging Face `datasets` stream, split or not): under torchrun, its shards
    (or every world_size-th example when the shards do not divide) via `split_dataset_by_node`."""
    if dist is None or dist.world_size == 1 or not type(ds).__module__.startswith("datasets."):
        return ds, False
    from datasets.distributed import split_dataset_by_node  # the stream is datasets': it is installed

    return split_dataset_by_node(ds, rank=dist.rank, world_size=dist.world_size), True


def _stream_loader(ds, batch_size: int):
    """An IterableDataset in batches: torchdata's StatefulDataLoader when installed (exact resume when
    the dataset has state_dict/load_state_dict, else it fast-forwards), else torch's DataLoader."""
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader  # optional: the `stream` extra
    except ImportError:
        log.warning("data: an IterableDataset without torchdata resumes by re-reading the stream; "
                    "pip install 'ecotrain[stream]' for an exact resume")
        return torch.utils.data.DataLoader(ds, batch_size=batch_size)
    # torchdata 0.11 calls a torch API that torch 2.13 deprecates, once per iterator: not the user's concern
    warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning)
    return StatefulDataLoader(ds, batch_size=batch_size)


def as_bundle(data, num_classes: Optional[int] = None, fingerprint: Optional[str] = None,
              batch_size: int = 1, dist=None) -> DataBundle:
    """The user's data: a DataBundle, or a dict/tuple of train/val/test, each given as (x, y) arrays, a
    Dataset (items of any structure), an IterableDataset or a DataLoader; or just the train split."""
    if isinstance(data, DataBundle):
        return data
    if isinstance(data, Mapping) and "train" in data:
        parts = data
    elif isinstance(data, (tuple, list)) and len(data) in (2, 3) and not _is_arrays(data):
        parts = dict(zip(("train", "val", "test"), data))
    else:
        parts = {"train": data}
    unknown = sorted(set(parts) - {"train", "val", "test"})
    if unknown:
        raise DataError(f"data: unknown split {unknown[0]!r}; give 'train', and optionally 'val' and 'test'")
    train = _as_source(parts.get("train"), "train data", batch_size, dist)
    if train is None:
        raise DataError("data: a train split is required")
    val, test = (_as_source(parts.get(k), f"{k} data", batch_size, dist) for k in ("val", "test"))
    sample = _first_batch(train)
    y0 = sample[1] if _is_xy(sample) else None
    if num_classes is None and y0 is not None and not torch.is_floating_point(y0):  # class ids
        if isinstance(train, ArraySource) or (y0.ndim == 1 and isinstance(train, MapSource) and train.has_labels()):
            num_classes = int(train.labels().max()) + 1  # arrays, or a labels attribute: no item read
        elif y0.ndim == 1:
            num_classes = getattr(getattr(train, "ds", None), "num_classes", None)
    shape = tuple(_first_tensor(sample).shape[1:])
    return DataBundle(train, val, test, num_classes, shape, sample=sample,
                      content_hash=("user:" + fingerprint) if fingerprint else "")


def _is_arrays(data) -> bool:
    """(x, y) arrays given as the data itself, not a (train, val[, test]) tuple of splits."""
    return len(data) == 2 and all(isinstance(v, (np.ndarray, torch.Tensor)) for v in data)


def _first_batch(source):
    """One batch of one item (a loader: its first batch), for the task's and the model's shapes."""
    if isinstance(source, LoaderSource):
        return source.first_batch()
    try:
        return source.take(torch.tensor([0]))
    except EcotrainError:
        raise
    except Exception as exc:
        raise DataError(f"data: reading item 0 of the train data raised {describe(exc)}") from None


def _first_tensor(batch) -> torch.Tensor:
    found = leaves(batch)
    if not found:
        raise DataError(f"data: a batch holds no tensor ({describe_batch(batch)}); items must hold tensors or arrays")
    return found[0]
