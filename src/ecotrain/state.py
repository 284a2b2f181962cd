"""TrainState: everything the loop and the callbacks share, passed as one explicit object.

Callbacks read it and ask for changes through its flags (`should_stop`, `skip_step`), never by
reaching into the loop."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn

from ecotrain.config import Config
from ecotrain.distributed import Dist


@dataclass
class TrainState:
    config: Config
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    task: Any
    precision: Any
    device: torch.device
    steps_per_epoch: int
    total_steps: int  # the planned step budget (min of max_steps and max_epochs * steps_per_epoch)
    run_dir: Optional[Path] = None
    dist: Any = field(default_factory=Dist)  # distributed.py; the one-process Dist when not under torchrun

    # position
    step: int = 0  # optimizer steps taken
    epoch: int = 0  # completed epochs
    batch_in_epoch: int = 0  # effective batches consumed in the current epoch
    samples_seen: int = 0

    # requests from callbacks
    should_stop: bool = False
    stopped_because: Optional[str] = None
    skip_step: bool = False

    # the latest numbers
    loss: Optional[torch.Tensor] = None  # this step's loss, detached, on device (no sync)
    window_losses: list = field(default_factory=list)  # step losses since the last log line
    last_log: dict = field(default_factory=dict)
    last_eval: dict = field(default_factory=dict)

    # best validation result (kept by BestTracker)
    best_metric: Optional[float] = None
    best_step: Optional[int] = None
    best_weights: Optional[dict[str, torch.Tensor]] = None
    evals_since_best: int = 0

    train_seconds: float = 0.0
    extra: dict = field(default_factory=dict)  # room for callbacks' own summary figures

    def stop(self, reason: str) -> None:
        if not self.should_stop:
            self.should_stop, self.stopped_because = True, reason

    @property
    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def position(self) -> dict:
        return {"step": self.step, "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch,
                "samples_seen": self.samples_seen}
