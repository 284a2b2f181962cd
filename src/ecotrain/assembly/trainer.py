"""`fit()`: assemble a run (assemble.py), train it (loop.py), finish it (finish.py).

The Python API and the CLI both land here, so they get the same loop, callbacks and run folder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from torch import nn

from ecotrain.assembly import wings
from ecotrain.base import rundir
from ecotrain.core import distributed, loop, threads
from ecotrain.core import resume as resume_mod
from ecotrain.assembly.assemble import RunOptions, UserParts, assemble
from ecotrain.core.loop import make_evaluate
from ecotrain.data.loader import Feed
from ecotrain.callbacks import Callback
from ecotrain.checkpoint.snapshot import load_model_weights
from ecotrain.base.log import log
from ecotrain.core.preemption import Preemption
from ecotrain.base.rundir import write_json
from ecotrain.base.runfiles import RunFiles
from ecotrain.config import Config
from ecotrain.data.tokenizer import save_tokenizer
from ecotrain.core.device import resolve_device
from ecotrain.base.errors import PreemptedError
from ecotrain.assembly.finish import finish, preempted_summary
from ecotrain.memory.planner import PLAN_FILE
from ecotrain.core.precision import tf32
from ecotrain.core.seeding import deterministic_algorithms, nondeterministic_error, seed_everything
from ecotrain.core.state import TrainState
from ecotrain.base.tensorfile import read_tensors


@dataclass
class RunResult:
    run_dir: Path
    summary: dict
    model: nn.Module
    state: Optional[TrainState]  # None: a finished run resumed (nothing trained)


def fit(config: Config, *, model: Optional[nn.Module] = None, data: Any = None,
        loss_fn: Optional[Callable] = None, metrics: Optional[Mapping[str, Callable]] = None,
        callbacks: Sequence[Callback] = (), methods: Sequence = (), run_dir: str | Path | None = None,
        quiet: bool = False, resume: str | Path | None = None, allow_config_change: bool = False,
        init_from: str | Path | None = None, keep_optimizer: bool = False, overwrite: bool = False,
        preemption: Optional[Preemption] = None, task: Any = None, optimizer: Optional[Callable] = None,
        scheduler: Optional[Callable] = None) -> RunResult:
    """Train `config` end to end. Pass `model`, `data`, `loss_fn`, `metrics`, `callbacks`, `methods`
    (ecotrain.methods.Method objects) to use your own parts.

    `data`: (x, y) arrays, a map-style Dataset (items of any structure), an IterableDataset, a
    DataLoader (torchdata's StatefulDataLoader: exact resume), or {"train": ..., "val": ..., "test": ...}.
    `task`: a Task (ecotrain.core.task: forward/loss/units/metrics); None: `config.task` (auto: from the data).
    `metrics`: {name: stateful metric (update/compute/reset) or fn(preds, target) -> batch mean}.
    `optimizer`: a factory taking the parameter groups (methods' freezing and per-group LRs applied)
    and returning a torch optimizer; `scheduler`: a factory taking the optimizer, returning an LR
    scheduler stepped every step (or epoch, with schedule.interval=epoch).

    `resume`: a checkpoint folder to continue from exactly; "auto": the newest valid one in `run_dir`
    (none yet: start fresh), for a job that is restarted after a kill. `init_from`: a checkpoint folder or
    weights file to start a new run from (its optimizer state too with `keep_optimizer`).
    `run_dir` must not hold a run unless resuming, or with `overwrite`.
    With `config.deterministic`, torch's deterministic-algorithm flags are set for the call and
    restored on return; so is torch's thread count (`config.threads`, auto: the cores this process
    may use; threads.py). SIGTERM/SIGINT handlers are installed for the call (main thread only);
    the CLI passes its own `preemption`, installed before the slow imports."""
    with rundir.hold(run_dir):  # from the first decision to the last write: one command in the folder
        if resume == "auto":  # the newest valid checkpoint in run_dir, or a fresh start (a restarted job)
            resume, overwrite = resume_mod.auto(run_dir, overwrite)
        return _fit_options(config, UserParts(model, data, loss_fn, metrics, callbacks, methods, task, optimizer,
                                              scheduler), run_dir, quiet, resume, allow_config_change, init_from,
                            keep_optimizer, overwrite, preemption)


def _finished(run_dir: Path, summary: dict, model: nn.Module) -> RunResult:
    """A resume of a finished run (checked like any resume: config, data, weights): nothing trained,
    nothing written; the model gets the run's final weights (model.safetensors)."""
    log.info(f"{run_dir}: the run finished at step {summary['steps']} ({summary['stopped_because']}); nothing "
             "to resume, its files are kept as they are")
    load_model_weights(model, read_tensors(RunFiles(run_dir).model), RunFiles(run_dir).model)
    return RunResult(run_dir, summary, model, None)


def _fit_options(config, parts, run_dir, quiet, resume, allow_config_change, init_from, keep_optimizer, overwrite,
                 preemption) -> RunResult:
    opts = RunOptions(Path(run_dir) if run_dir else None, quiet, Path(resume) if resume else None,
                      allow_config_change, init_from, keep_optimizer, overwrite)
    preemption = preemption or Preemption()
    with (preemption, deterministic_algorithms(config.deterministic),  # the handler first: set-up is slow
          threads.for_fit(config.threads, config.data.workers, opts.resume) as opts.threads,
          tf32(config.tf32, resolve_device(config.device), config.precision)):
        seed_everything(config.seed)
        dist = distributed.setup(config, resolve_device(config.device))
        try:
            result = _fit(config, dist, parts, opts, preemption)
        except RuntimeError as exc:  # a dead peer or a timed-out collective, an op with no deterministic kernel
            err = distributed.collective_error(exc, dist) or nondeterministic_error(exc)
            if err is None:
                raise
            raise err from None
        finally:
            dist.stop_watch()  # no training thread marks work any more (stallwatch.py)
        # the ranks' barrier only after a run they all ended together: a rank failing alone must not wait
        # in it while the others wait in the step's collectives (both until the timeout); it exits instead
        dist.shutdown()
        return result


def _fit(cfg: Config, dist, parts: UserParts, opts: RunOptions, preemption: Preemption) -> RunResult:
    run = None
    try:
        run = assemble(cfg, dist, resolve_device(cfg.device), parts, opts, preemption, wings.WINGS)
        if preemption.requested:  # a signal during set-up: nothing trained, nothing to keep
            raise PreemptedError(f"{preemption.requested} received during start-up; nothing was trained yet")
        done = resume_mod.finished(opts.run_dir, opts.resume, cfg)  # after the resume's checks, before a write
        if done is not None:
            run.folder.release()
            return _finished(run.folder.path, done, dist.unwrap(run.state.model))
        run.folder.accept(cfg.to_dict(), run.metrics_offset)
        if run.memory_plan is not None and dist.is_main:  # memory.budget's choice: a resume reads it back
            write_json(run.folder.path / PLAN_FILE, run.memory_plan)
        if dist.is_main:  # token data's tokenizer, for predict and export (data/tokenizer.py)
            save_tokenizer(run.folder.path, run.bundle.extra.get("tokenizer"))
    except BaseException:
        if run is not None:
            run.folder.discard()
        raise
    state = run.state
    preemption.watch(cfg.preemption)  # a notice file or endpoint, polled in a thread (preemption.py)
    try:
        try:
            loop.train(state, Feed(state, run.sampler, run.source), run.cbs, run.augment, make_evaluate(run.bundle))
        except BaseException as exc:
            run.cbs.on_exception(state, exc)
            if isinstance(exc, (Exception, SystemExit)):  # where in training it failed, for the CLI's one line (cli/program)
                exc.add_note(f"during training step {state.step + 1} (epoch {state.epoch})")
            raise
        if state.stopped_because == "preempted":
            return RunResult(run.folder.path, preempted_summary(run), state.model, state)
        return RunResult(run.folder.path, finish(run), state.model, state)
    finally:
        preemption.stop_watching()
        run.folder.release()  # the run folder's one-writer lock
