"""Divergence guard: a NaN/Inf loss never trains on silently; it stops the run or skips the step.

A poisoned step (non-finite gradients) is never applied, and under torchrun every rank takes the
same decision at the same step, with no collective per step (a per-step all-reduce cost a small
DDP model a quarter of its speed):
- One process: the loss is checked (a host sync per checked step; `check_every` > 1 amortises
  it on GPUs, and leaves the steps in between unchecked).
- DDP: the gradients are checked. After backward they are all-reduced, the same on every rank, so
  a non-finite loss on any rank shows up as non-finite gradients on all of them, and each rank
  decides alone, identically. The check is the grad scaler's fused foreach kernel with a scale of
  1 (the gradients stay bit-for-bit the same). A rank's non-finite loss whose gradients stayed
  finite (a loss term with no gradient) cannot poison the weights: that rank requests it in the
  run's `distributed.Agreement`, and every rank stops (action=skip: warns) at the next agreement
  step (about every AGREE_SECONDS of training).
- DDP with fp16-mixed: the grad scaler already skips steps with non-finite gradients, on every
  rank alike (it reads the same all-reduced gradients), and a scaled overflow is no divergence.
  Each rank checks its own loss; a non-finite one is agreed as above.
- FSDP: each rank holds a different shard of the gradients, so rank-local checks could disagree;
  the loss is all-reduced on each checked step (FSDP runs collectives in every forward anyway).
"""

from __future__ import annotations

import torch

from ecotrain.callbacks.base import Callback
from ecotrain.log import log


class DivergenceGuard(Callback):
    def __init__(self, action: str = "stop", max_skips: int = 10, check_every: int = 1):
        self.action, self.max_skips, self.check_every = action, max_skips, check_every
        self.skipped = 0
        self._mode = "loss"  # loss | grads | agreed-loss | all-reduced-loss (see the module docstring)
        self._grads: GradCheck | None = None
        self._agreement = None

    def on_fit_start(self, state):
        dist = state.dist
        self._mode, self._agreement = "loss", None
        if dist.world_size > 1:
            self._agreement = dist.agreement()
            if dist.strategy == "fsdp":
                self._mode = "all-reduced-loss"
            elif getattr(state.precision, "scaler", None) is not None:
                self._mode = "agreed-loss"
            else:
                self._mode, self._grads = "grads", GradCheck(state.model)

    def on_after_backward(self, state):
        if self.check_every > 1 and state.step % self.check_every:
            return
        mode = self._mode
        if mode == "loss":
            loss = state.loss.item()
        elif mode == "all-reduced-loss":
            loss = state.dist.all_reduce_sum(state.loss).item()  # every rank the same sum
        else:
            loss = state.loss.item()  # this rank's alone
            if mode == "grads" and not self._grads.finite():  # the same gradients on every rank
                self._diverged(state, f"gradients are non-finite (this rank's loss: {loss})")
                return
            if loss - loss != 0:  # finite gradients, or fp16's scaler skips the step: agree on it
                self._agreement.request("nonfinite_loss")
            return
        if loss - loss != 0:  # not finite (inf - inf and nan - nan are nan)
            self._diverged(state, f"loss is {loss}")

    def _diverged(self, state, what: str) -> None:
        where = f"step {state.step + 1} (epoch {state.epoch + 1})"
        if self.action == "skip" and self.skipped < self.max_skips:
            self.skipped += 1
            state.skip_step = True
            log.warning(f"{what} at {where}; step skipped ({self.skipped}/{self.max_skips})")
            return
        state.skip_step = True  # never apply the poisoned gradients
        log.warning(f"{what} at {where}; stopping. Lower optim.lr, set loop.grad_clip, or check the data")
        state.stop("diverged")

    def on_step_end(self, state):
        if self._agreement is None or "nonfinite_loss" not in self._agreement.poll(state.step):
            return
        what = f"the loss was non-finite on a rank at or before step {state.step} (epoch {state.epoch + 1})"
        if self.action == "skip":
            log.warning(f"{what}; its gradients were finite or skipped by the fp16 grad scaler")
            return
        log.warning(f"{what}; stopping. Lower optim.lr, set loop.grad_clip, or check the data")
        state.stop("diverged")

    def on_fit_end(self, state):
        state.counters.skipped_nonfinite_steps = self.skipped

    def state_dict(self):
        return {"skipped": self.skipped}

    def load_state_dict(self, sd):
        self.skipped = sd.get("skipped", 0)


class GradCheck:
    """Are all of `model`'s gradients finite? One fused kernel per (device, dtype) group: the grad
    scaler's `_amp_foreach_non_finite_check_and_unscale_` with a scale of 1, so nothing changes."""

    def __init__(self, model: torch.nn.Module):
        groups: dict = {}
        for p in model.parameters():
            if p.requires_grad:
                groups.setdefault((p.device, p.dtype), []).append(p)
        self.groups = [(ps, torch.zeros(1, device=d), torch.ones(1, device=d)) for (d, _), ps in groups.items()]

    def finite(self) -> bool:
        bad = None
        for params, found, one in self.groups:
            grads = [p.grad._values() if p.grad.is_sparse else p.grad for p in params if p.grad is not None]
            if grads:
                found.zero_()
                torch._amp_foreach_non_finite_check_and_unscale_(grads, found, one)
                bad = found if bad is None else bad + found.to(bad.device)
        return bad is None or not bad.item()
