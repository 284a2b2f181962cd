"""TrainState: everything the loop and the callbacks share, passed as one explicit object.

Callbacks read it and ask for changes through its flags (`should_stop`, `skip_step`), never by
reaching into the loop. Every figure has an owner and a field; there is no grab-bag: `Counters`
are the loop's and the callbacks' event counts (checkpointed, summed over resumed segments),
`progress_fields` are display strings for the progress bar only (never written to files).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Protocol

import torch
from torch import nn

from ecotrain.config import Config
from ecotrain.core.distributed import Dist
from ecotrain.core.objective import Objective
from ecotrain.core.precision import Precision
from ecotrain.core.stepplan import StepPlan

if TYPE_CHECKING:  # the methods' floor sits above this one: the type only, never the import
    from ecotrain.data.sources import LoaderSource  # data/ sits beside the engine: the type only
    from ecotrain.methods.base import Methods


class CostListener(Protocol):
    """Who accounts for a run's cost (the ledger) and must hear of work a step's measured count misses."""

    def flops_changed(self) -> None: ...
    def add_flops(self, n: float, label: str) -> None: ...


@dataclass
class Counters:
    """Event counts of a run; ride in the checkpoint, land in summary.json."""

    oom_recoveries: int = 0  # memory.recover_from_oom
    skipped_nonfinite_steps: int = 0  # DivergenceGuard, action=skip
    data_wait_seconds: float = 0.0  # data/loader.py Feed: the loop's time waiting for batches
    rollbacks: int = 0  # DivergenceGuard, action=rollback
    resumes: int = 0  # assemble: a segment that continued from a checkpoint
    steps_redone: int = 0  # resume.steps_past: steps a killed segment trained after its checkpoint
    checkpoint_blocked_seconds: float = 0.0  # Checkpointer: the loop's time inside saves (a copy, when in the background)
    skipped_samples: int = 0  # data/loader.py Feed: damaged samples left out of training batches (on_bad_shard=skip)

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, sd: dict) -> None:
        for k, v in sd.items():
            if hasattr(self, k):
                setattr(self, k, v)


@dataclass
class TrainState:
    config: Config
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any  # an LR scheduler: built-in (optim.py) or the user's, anything with step()/state_dict()
    objective: Objective  # the task loss plus the methods' named terms
    precision: Precision
    device: torch.device
    steps_per_epoch: int
    total_steps: int  # the planned step budget (min of max_steps and max_epochs * steps_per_epoch)
    run_dir: Optional[Path] = None
    dist: Dist = field(default_factory=Dist)  # distributed.py; the one-process Dist when not under torchrun
    methods: Optional[Methods] = None
    data_source: Optional["LoaderSource"] = None  # a user's loader: its state and its own RNG ride in the checkpoint
    plan: Optional[StepPlan] = None  # how a step is cut (stepplan.py); assemble resolves it, None: from the config

    # position
    step: int = 0  # optimizer steps taken
    epoch: int = 0  # completed epochs
    batch_in_epoch: int = 0  # effective batches consumed in the current epoch
    samples_seen: int = 0

    # requests from callbacks
    should_stop: bool = False
    stopped_because: Optional[str] = None
    skip_step: bool = False
    rewound: bool = False  # a rollback moved the position back: the loop restarts its batch iterator

    # the latest numbers
    loss: Optional[torch.Tensor] = None  # this step's loss, detached, on device (no sync)
    loss_parts: Optional[dict] = None  # this step's named loss terms (methods on), detached
    window_losses: list = field(default_factory=list)  # step losses since the last log line
    window_parts: dict = field(default_factory=dict)  # term -> step values since the last log line
    last_log: dict = field(default_factory=dict)
    last_eval: dict = field(default_factory=dict)

    # best validation result (kept by BestTracker)
    best_metric: Optional[float] = None
    best_step: Optional[int] = None
    best_weights: Optional[dict[str, torch.Tensor]] = None
    evals_since_best: int = 0

    counters: Counters = field(default_factory=Counters)
    last_checkpoint: Optional[str] = None  # set by the Checkpointer
    notice_to_checkpoint_s: Optional[float] = None  # Checkpointer: a preemption notice -> complete checkpoint
    progress_fields: dict = field(default_factory=dict)  # display only: the bar shows what callbacks put here
    cost_listeners: list[CostListener] = field(default_factory=list)  # told of work a step's count misses
    train_seconds: float = 0.0  # the loop's time, all segments; `elapsed()` for a live figure
    segment_start: Optional[float] = None  # perf_counter when this segment's loop started

    def __post_init__(self):
        if self.plan is None:
            self.plan = StepPlan.resolve(self.config)

    @property
    def task(self):
        return self.objective.task

    def stop(self, reason: str) -> None:
        if not self.should_stop:
            self.should_stop, self.stopped_because = True, reason

    def flops_changed(self) -> None:
        """A method changed the per-sample work (a layer shrank, the input length or batch size
        changed): the ledger banks the FLOPs so far and measures the next step again."""
        for listener in self.cost_listeners:
            listener.flops_changed()

    def add_flops(self, n: float, label: str) -> None:
        """A one-off cost inside this run but outside the measured steps (a teacher's forward pass
        over the training set to cache its logits); listed under ledger.json `flops.extra`."""
        for listener in self.cost_listeners:
            listener.add_flops(n, label)

    def elapsed(self) -> float:
        """Training seconds so far, earlier segments included (a checkpoint saves this)."""
        live = time.perf_counter() - self.segment_start if self.segment_start is not None else 0.0
        return self.train_seconds + live

    @property
    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def eval_model(self) -> nn.Module:
        """The module whose weights are evaluated, kept as best and saved: the bare model, or a
        method's (EMA's average)."""
        bare = self.dist.unwrap(self.model)
        return self.methods.eval_model(bare) if self.methods else bare

    def position(self) -> dict:
        return {"step": self.step, "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch,
                "samples_seen": self.samples_seen}
