"""Batch-size ramp-up: small batches first (more updates per sample while the loss falls fast),
up to data.batch_size, with the learning-rate rule explicit.

    methods:
      - name: batch_ramp
        lr_scaling: sqrt   # none | linear | sqrt: lr x (batch / full)^(0 | 1 | 1/2); required
        start: 0.25        # the first batch size, as a fraction of data.batch_size (x loop.accumulate)
        steps: 500         # optimizer steps until the full size
        stages: 3          # smaller sizes on the way: start, ..., evenly spaced

The batch size is a function of the global step; an epoch is the engine's seeded order cut into
those sizes, so epoch e's batches depend only on (seed, e, the config) and a resume at a batch
index replays nothing. The step an epoch starts at is counted from the sizes (integer work). The
LR of each step is the schedule's value times the scaling factor, asked of the schedule at the
step's start (`Schedule.scale`, saved with it), so it composes with any built-in schedule (a user's
own scheduler, fit(scheduler=...), is refused in one line); the rule, the sizes and the factors are a log line at the start and
at each change, and go to summary.json `methods.batch_ramp`. Each size change calls `state.flops_changed()`.

Plan with loop.max_steps (it is required): the step count of max_epochs epochs is not the
engine's `epochs x batches`. Not under torchrun (sharding cuts fixed-size batches).

When it helps: early training, where the gradient noise scale is small and a small batch buys
as much progress per sample as a big one; under a step budget it trains on fewer samples.
Risks: a too small start or a linear LR rule at a small start makes the early steps noisy.
Cost: none beyond the smaller steps' lower hardware efficiency (more steps per sample).
"""

from __future__ import annotations

import torch

from ecotrain.base.errors import ConfigError
from ecotrain.base.log import log
from ecotrain.methods.base import Method
from ecotrain.methods.sampling import epoch_order, plain
from ecotrain.core.stepplan import step_batch_size

EXPONENT = {"none": 0.0, "linear": 1.0, "sqrt": 0.5}


class RampSampler:
    """The base sampler's epoch order, cut into the ramp's batch sizes."""

    def __init__(self, base, size_at):
        self.base, self.size_at = base, size_at
        self.n, self.batch_size, self.seed = base.n, base.batch_size, base.seed
        self._starts = [0]  # global step at which each epoch starts, extended on demand

    def __len__(self) -> int:  # full-size batches: what the engine plans with
        return len(self.base)

    def _count(self, step0: int) -> int:
        steps, left = 0, self.n
        while left > 0:
            left -= self.size_at(step0 + steps)
            steps += 1
        return steps

    def start_step(self, epoch: int) -> int:
        while len(self._starts) <= epoch:
            self._starts.append(self._starts[-1] + self._count(self._starts[-1]))
        return self._starts[epoch]

    def epoch_order(self, epoch: int) -> torch.Tensor:
        return epoch_order(self.base, epoch)

    def batches(self, epoch: int, start: int = 0):
        order, step, pos = self.epoch_order(epoch), self.start_step(epoch), 0
        b = 0
        while pos < self.n:
            size = self.size_at(step + b)
            if b >= start:
                yield order[pos:pos + size]
            pos, b = pos + size, b + 1


class BatchRamp(Method):
    needs = ("schedule",)  # the LR is scaled through ecotrain's schedule (a user's own is refused: assemble)

    def __init__(self, cfg, run, trained=None):
        if run.loop.max_steps is None:
            raise ConfigError("methods.batch_ramp: set loop.max_steps (the ramp changes the number of steps an "
                              "epoch takes, so max_epochs alone cannot plan the schedule)")
        if run.distributed.strategy != "none":
            raise ConfigError("methods.batch_ramp: not under torchrun (ranks shard fixed-size batches); "
                              "drop it or train in one process")
        self.key, self.rule, self.steps = "batch_ramp", cfg.lr_scaling, cfg.steps
        self.full = step_batch_size(run)
        fracs = [cfg.start + (1 - cfg.start) * i / cfg.stages for i in range(cfg.stages)]
        self.sizes = [max(1, round(self.full * f)) for f in fracs]
        self.sampler = None

    def size_at(self, step: int) -> int:
        if step >= self.steps:
            return self.full
        return self.sizes[step * len(self.sizes) // self.steps]

    def lr_scale(self, step: int) -> float:
        return (self.size_at(step) / self.full) ** EXPONENT[self.rule]

    def data(self, source, sampler):
        self.sampler = RampSampler(plain(sampler, "batch_ramp"), self.size_at)
        return source, self.sampler

    def on_fit_start(self, state):
        if state.step < self.steps:
            log.info(f"batch_ramp: batch sizes {self.sizes} over steps 0-{self.steps}, then {self.full}; "
                     f"LR scaling {self.rule} (x{', x'.join(f'{self.lr_scale(s):.3g}' for s in self._firsts())})")

    def _firsts(self) -> list[int]:
        return [i * self.steps // len(self.sizes) for i in range(len(self.sizes))]

    def on_step_start(self, state):
        if state.step > self.steps:  # the full size (a factor of 1 since step `steps`): the schedule's own LR
            return
        state.scheduler.scale(self.key, self.lr_scale(state.step))  # the schedule writes it (optim.Schedule)

    def on_step_end(self, state):
        if state.step <= self.steps and self.size_at(state.step) != self.size_at(state.step - 1):
            log.info(f"batch_ramp: step {state.step}: batch size {self.size_at(state.step)}, "
                     f"LR x{self.lr_scale(state.step):.3g} ({self.rule})")
            state.flops_changed()

    def summary(self) -> dict:
        return {"lr_scaling": self.rule, "sizes": self.sizes + [self.full],
                "from_steps": self._firsts() + [self.steps], "lr_scales": [
                    self.lr_scale(s) for s in self._firsts()] + [1.0]}
