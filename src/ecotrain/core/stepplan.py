"""How one optimizer step is cut: the one place that says it (`StepPlan`).

`data.batch_size * loop.accumulate` samples make a step (the sampler's batch, `step_batch`); the
loop cuts them into `micro_batches` pieces, which is `loop.accumulate` unless a memory plan
(`memory.budget`), `loop.micro_batch_size` at this world size, a checkpoint of a run whose memory
ran out, or another rank's out-of-memory note (memory.OOM_HINT) says more; evaluation reads
`eval_batch` samples at a time. `resolve` settles it once, in that order, when a run is assembled;
at run time `raise_micro_batches` (OOM recovery) is its one writer. The checkpoint keeps a raised
count where it always has, as `counters/micro_batches` (None: not raised), so every checkpoint loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

EVAL_BATCH_FACTOR = 4  # evaluation holds no activations for backward: 4x the training batch fits


def step_batch_size(cfg) -> int:
    """Samples per optimizer step: `data.batch_size * loop.accumulate` (the sampler's batch)."""
    return cfg.data.batch_size * cfg.loop.accumulate


def eval_batch_size(cfg) -> int:
    """The batch evaluation reads (a run's, or a trained model's in `eval`/`predict`); memory.budget sets
    `memory.eval_batch_size` so that evaluation stays within the budget (memory/planner.py)."""
    return cfg.memory.eval_batch_size or cfg.data.batch_size * EVAL_BATCH_FACTOR


@dataclass
class StepPlan:
    batch_size: int  # data.batch_size: the samples of one step before accumulation
    accumulate: int  # loop.accumulate
    micro_batches: int  # the pieces a step is cut into (at least 1)
    eval_batch: int

    @property
    def step_batch(self) -> int:
        """Samples per optimizer step (the sampler's batch): accumulation equals this one big batch."""
        return self.batch_size * self.accumulate  # step_batch_size(cfg) of the config it was resolved from

    @property
    def raised(self) -> Optional[int]:
        """The micro-batch count when something raised it past `loop.accumulate`, else None."""
        return self.micro_batches if self.micro_batches != self.accumulate else None

    @classmethod
    def resolve(cls, cfg, planned: Optional[int] = None, saved: Optional[int] = None, derived: Optional[int] = None,
                hint: Optional[int] = None) -> "StepPlan":
        """planned: the memory plan's count; saved: the checkpoint's (a run whose memory ran out);
        derived: `loop.micro_batch_size` at this world size (wins over the checkpoint's, which another
        world size may have written); hint: another rank's out-of-memory note (only ever raises it)."""
        n = cfg.loop.accumulate
        for choice in (planned, saved, derived):
            if choice is not None:
                n = choice
        if hint is not None and hint > n:
            n = hint
        return cls(cfg.data.batch_size, cfg.loop.accumulate, n, eval_batch_size(cfg))

    def raise_micro_batches(self, n: int) -> None:
        """OOM recovery's cut (core/levers.py), and the memory planner's measuring worker: the one writer."""
        self.micro_batches = n
