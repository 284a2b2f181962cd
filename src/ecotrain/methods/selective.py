"""Selective backprop (Jiang et al., 2019): forward the whole effective batch without gradients,
then forward and backward only its highest-loss fraction.

    methods:
      - name: selective_backprop
        keep: 0.5        # fraction of each effective batch that is backpropagated
        start_step: 0    # full backprop before this step

It runs as the Objective's `prepare_batch` (objective.py), on the whole effective batch before the
micro-batches are cut, so accumulation stays exactly one big batch of the kept samples. The
scoring pass runs in eval mode (no dropout draw, BatchNorm statistics untouched) under no_grad;
the kept samples are taken in their batch order. Both passes sit inside the step the ledger
measures with FlopCounterMode: the run is charged a forward on every sample plus a forward and
backward on the kept ones, per sample trained (samples_seen counts the whole batch).

When it helps: late in training, when most samples are already fit and their gradients are
near zero; the backward is about 2/3 of a step's FLOPs. Risks: it focuses on noisy or mislabelled
samples, and the logged training loss is the kept (hardest) samples' mean, higher than the
batch's. Cost: the scoring forward (about 1/3 of a full step) on every sample.
"""

from __future__ import annotations

import torch

from ecotrain.core.batch import batch_size, select
from ecotrain.base.errors import ConfigError
from ecotrain.core.loop import set_train_mode
from ecotrain.methods.base import Method
from ecotrain.core.task import SequenceTask


def per_sample_loss(task, out, batch) -> torch.Tensor:
    """One loss per sample: the task's unreduced loss, averaged over a sequence's tokens."""
    if isinstance(task, SequenceTask):
        y = task.targets(batch)
        tok = task.loss(out, batch, "none").view(y.shape)
        mask = (y != task.IGNORE).float()
        return (tok * mask).sum(1) / mask.sum(1).clamp_min(1)
    n = batch_size(batch)
    try:
        losses = task.loss(out, batch, "none")
    except Exception:  # a user's mean-only loss function, a model that reduces its own loss
        losses = None
    if losses is None or losses.ndim == 0 or losses.shape[:1] != (n,):
        raise ConfigError(f"methods.selective_backprop: needs a per-sample loss (the built-in classification, "
                          f"regression and sequence tasks); this run's task ({getattr(task, 'name', 'user')}) "
                          "gives only the batch mean")
    return losses.reshape(n, -1).mean(1)


class _Bare:
    """`model.forward` behind a call: the task calls it like the model, without its top-level hooks."""

    def __init__(self, model):
        self.forward = model.forward

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)


def top_fraction(losses: torch.Tensor, keep: float) -> torch.Tensor:
    """Indices of the ceil(keep * n) highest losses, in ascending index order (ties: lower index first)."""
    k = max(1, int(-(-keep * len(losses) // 1)))
    order = torch.argsort(losses, descending=True, stable=True)[:k]
    return torch.sort(order).values


class SelectiveBackprop(Method):
    def __init__(self, cfg, run=None, trained=None):
        self.key, self.keep, self.start_step = "selective_backprop", cfg.keep, cfg.start_step
        self.samples = self.kept = 0  # this segment's and earlier ones' (state_dict)

    def prepare_batch(self, batch, state):
        if self.keep >= 1 or state.step < self.start_step:
            return batch
        model = state.model
        model.eval()
        try:
            with torch.no_grad(), state.precision.autocast():
                # .forward, not __call__: the top-level hooks are the ledger's forward-share probe, and
                # this pass is training cost (still counted in the step's total), not an evaluation's
                losses = per_sample_loss(state.task, state.task.forward(_Bare(model), batch), batch)
        finally:
            set_train_mode(state)  # train mode again, with the methods' train_mode (a BatchNorm freeze)
        idx = top_fraction(losses.float(), self.keep)
        self.samples, self.kept = self.samples + len(losses), self.kept + len(idx)
        return select(batch, idx)

    def summary(self) -> dict:
        return {"keep": self.keep, "start_step": self.start_step, "samples_scored": self.samples,
                "samples_backpropagated": self.kept}

    def state_dict(self) -> dict:
        return {"samples": self.samples, "kept": self.kept}

    def load_state_dict(self, sd: dict) -> None:
        self.samples, self.kept = sd["samples"], sd["kept"]
