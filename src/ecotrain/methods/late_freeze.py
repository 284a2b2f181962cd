"""Late layer freezing: for the last part of training, the first layers stop training.

    methods:
      - name: late_freeze
        freeze_depth: 2     # the first 2 top-level children that hold parameters; or
        freeze: ["stem"]    #   parameter-name globs, as finetune's
        at: 0.75            # from this fraction of the planned steps on

From the step `at x planned steps` on, the chosen parameters get `requires_grad=False`: their
gradients stay None, so the optimizer skips them (no update, no weight decay), and when they are
the first layers autograd computes no gradient below them at all, which is the saving. The frozen
set is a function of the step, re-applied on resume (requires_grad is not in the checkpoint).
The change calls `state.flops_changed()`, so the ledger measures the cheaper step.

When it helps: the first layers converge early (generic low-level features); the backward pass
through them is then paid for nothing. Risks: freezing too early or too deep costs accuracy; a
frozen layer's BatchNorm statistics still move (use methods.batchnorm for that). Cost: none.
Not under torchrun (DDP expects a fixed set of parameters with gradients).
"""

from __future__ import annotations

from torch import nn

from ecotrain.base.errors import ConfigError
from ecotrain.base.log import log
from ecotrain.methods.base import Method
from ecotrain.methods.finetune import matches


def chosen(model: nn.Module, globs: list[str], depth: int) -> list[str]:
    names = [n for n, _ in model.named_parameters()]
    out: set[str] = set()
    if depth:
        children = [(n, c) for n, c in model.named_children() if next(c.parameters(), None) is not None]
        if depth >= len(children):
            raise ConfigError(f"methods.late_freeze.freeze_depth: {depth} would freeze all of the model's "
                              f"{len(children)} top-level children with parameters; freeze fewer")
        for n, c in children[:depth]:
            out |= {f"{n}.{p}" for p, _ in c.named_parameters()}
    for pattern in globs:
        hit = {n for n in names if matches(n, pattern)}
        if not hit:
            raise ConfigError(f"methods.late_freeze.freeze: '{pattern}' matches no parameter; names look like "
                              f"{', '.join(names[:6])}")
        out |= hit
    if len(out) == len(names):
        raise ConfigError("methods.late_freeze: that freezes every parameter; freeze fewer")
    return [n for n in names if n in out]


class LateFreeze(Method):
    def __init__(self, cfg, run, trained=None):
        if run.distributed.strategy != "none":
            raise ConfigError("methods.late_freeze: not under torchrun (DDP/FSDP expect the same parameters to "
                              "have gradients every step); drop it or train in one process")
        self.key, self.globs, self.depth, self.at = "late_freeze", list(cfg.freeze), cfg.freeze_depth, cfg.at
        self.names: list[str] = []
        self.params: list[nn.Parameter] = []
        self.at_step = None
        self.frozen = False

    def transform(self, model):
        self.names = chosen(model, self.globs, self.depth)  # checked at start, not at 75%
        params = dict(model.named_parameters())
        self.params = [params[n] for n in self.names]
        return model

    def on_fit_start(self, state):
        self.at_step = int(self.at * state.total_steps)
        if state.step >= self.at_step:  # a resume past the point: frozen again
            self._freeze()

    def on_step_end(self, state):
        if not self.frozen and state.step >= self.at_step:  # the next step trains without them
            self._freeze()
            log.info(f"late_freeze: step {state.step}: froze {len(self.names)} tensors "
                     f"({sum(p.numel() for p in self.params)} parameters)")
            state.flops_changed()

    def _freeze(self) -> None:
        for p in self.params:
            p.requires_grad_(False)
            p.grad = None
        self.frozen = True

    def summary(self) -> dict:
        return {"at_step": self.at_step, "frozen_tensors": len(self.names),
                "frozen_parameters": sum(p.numel() for p in self.params), "names": self.names[:20]}
