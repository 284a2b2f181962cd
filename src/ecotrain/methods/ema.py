"""EMA of weights: evaluate, keep as best, test and save an exponential moving average of the
parameters (buffers such as BatchNorm statistics are copied as they are).

When it helps: noisy small-batch training, long runs at a constant LR; the average usually
generalises a little better than the last iterate. Risks: a decay too close to 1 averages in
early, bad weights (the warm-up below shortens the memory at the start). Cost: one fused
`lerp` over the parameters per update (`every` > 1 amortises it) and one extra copy of the model.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from ecotrain.base.errors import ConfigError
from ecotrain.methods.base import Method


class EMA(Method):
    def __init__(self, cfg, run=None, trained=None):
        if run is not None and run.distributed.strategy == "fsdp":
            raise ConfigError("methods.ema: not supported with distributed.strategy=fsdp (sharded parameters); "
                              "use ddp or one process")
        self.key, self.decay, self.every, self.warmup = "ema", cfg.decay, cfg.every, cfg.warmup
        self.updates, self.last_step = 0, -1
        self.shadow: nn.Module | None = None
        self.state = None

    def transform(self, model):
        self.model = model  # the bare module (transform runs before the DDP wrap)
        self.shadow = copy.deepcopy(model).requires_grad_(False)
        self._pairs()
        return model

    def _pairs(self) -> None:
        self._src = [p.detach() for p in self.model.parameters()]
        self._dst = [p.detach() for p in self.shadow.parameters()]
        self._bsrc, self._bdst = list(self.model.buffers()), list(self.shadow.buffers())

    def current_decay(self) -> float:
        # the standard warm-up (TF's num_updates): an average of the first few iterates, not of the init
        return min(self.decay, (1 + self.updates) / (10 + self.updates)) if self.warmup else self.decay

    def on_fit_start(self, state):
        self.state = state
        if self.updates == 0:  # fresh: start from the weights training starts from (--init-from included)
            self.shadow.load_state_dict(self.model.state_dict())

    def on_step_end(self, state):
        self.update(state)

    @torch.no_grad()
    def update(self, state) -> None:
        """Fold this step's weights in, once per step; an evaluation inside the step (before
        on_step_end) calls it first, so it sees the average including this step."""
        if state.step == self.last_step or state.step % self.every or state.skip_step:
            return
        self.last_step = state.step
        torch._foreach_lerp_(self._dst, self._src, 1.0 - self.current_decay())
        for d, s in zip(self._bdst, self._bsrc):
            d.copy_(s)
        self.updates += 1

    def eval_model(self, model):
        if self.state is not None:
            self.update(self.state)
        return self.shadow

    def summary(self) -> dict:
        return {"decay": self.decay, "updates": self.updates}

    def state_dict(self) -> dict:
        return {"updates": self.updates, "last_step": self.last_step, "weights": dict(self.shadow.state_dict())}

    def load_state_dict(self, sd: dict) -> None:
        self.updates, self.last_step = sd["updates"], sd["last_step"]
        self.shadow.load_state_dict(sd["weights"])
