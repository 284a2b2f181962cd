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

One process only (refused under torchrun for now): `check_grads` also checks the gradients (a NaN
gradient under a finite loss), `spike_factor` treats a finite loss far above its running mean as
divergence, and action=rollback reloads the newest checkpoint whose tensors are all finite (through
the resume code, `checkpoint.snapshot.restore`), multiplies the LR by `rollback_lr_factor` (asked of
the schedule: `Schedule.scale`; a user's own scheduler is refused) and trains on, at most `max_rollbacks` times. A rollback is a resume in memory: everything a checkpoint holds
comes back, except what measures the run as it really went (time, the ledger, the event counters,
this guard's own counts), so the run stays exactly resumable after it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable, Optional

import torch

from ecotrain.callbacks.base import Callback, CallbackList
from ecotrain.checkpoint.format import read_checkpoint
from ecotrain.checkpoint.manager import list_checkpoints
from ecotrain.checkpoint.snapshot import restore
from ecotrain.base.errors import CheckpointError, ConfigError
from ecotrain.base.log import log

SPIKE_WARMUP = 10  # checked losses before a spike can be called: the first ones fall fast
SPIKE_DECAY = 0.9  # the running mean a spike is measured against (an EMA of the accepted losses)


class DivergenceGuard(Callback):
    keeps_state_on_rollback = True  # its count of rollbacks is what stops a run that keeps diverging

    def __init__(self, action: str = "stop", max_skips: int = 10, check_every: int = 1, *, check_grads: bool = False,
                 spike_factor: Optional[float] = None, max_rollbacks: int = 3, rollback_lr_factor: float = 0.5,
                 rollback: Optional[Callable] = None):
        self.action, self.max_skips, self.check_every = action, max_skips, check_every
        self.check_grads, self.spike_factor = check_grads, spike_factor
        self.max_rollbacks, self.lr_factor = max_rollbacks, rollback_lr_factor
        self._rollback = rollback  # state -> (folder, the restored state dict) | None: `roll_back` below
        self.skipped = self.rollbacks = 0
        self.lr_scale = 1.0  # product of the rollbacks' LR factors; checkpointed, applied on resume
        self.loss_mean: Optional[float] = None  # running mean of accepted losses (spike_factor)
        self.losses_seen = 0
        self._pending: Optional[str] = None  # a divergence waiting for the step's end to roll back
        self._mode = "loss"  # loss | grads | agreed-loss | all-reduced-loss (see the module docstring)
        self._grads: GradCheck | None = None
        self._agreement = None

    @classmethod
    def from_config(cls, cfg, world_size: int = 1, rollback: Optional[Callable] = None) -> "DivergenceGuard":
        if world_size > 1 and (cfg.action == "rollback" or cfg.spike_factor or cfg.check_grads):
            raise ConfigError("divergence: action=rollback, spike_factor and check_grads are for one process only "
                              "(not under torchrun yet); use action=stop or skip")
        return cls(cfg.action, cfg.max_skips, cfg.check_every, check_grads=cfg.check_grads,
                   spike_factor=cfg.spike_factor, max_rollbacks=cfg.max_rollbacks,
                   rollback_lr_factor=cfg.rollback_lr_factor, rollback=rollback)

    def on_fit_start(self, state):
        dist = state.dist
        self._mode, self._agreement, self._grads = "loss", None, None
        if dist.world_size > 1:
            self._agreement = dist.agreement()
            if dist.strategy == "fsdp":
                self._mode = "all-reduced-loss"
            elif getattr(state.precision, "scaler", None) is not None:
                self._mode = "agreed-loss"
            else:
                self._mode, self._grads = "grads", GradCheck(state.model)
        elif self.check_grads and getattr(state.precision, "scaler", None) is None:  # fp16: the scaler checks them
            self._grads = GradCheck(state.model)
        if self.lr_scale != 1.0:  # resumed after a rollback (a checkpoint whose schedule predates its scales)
            state.scheduler.scale("divergence", self.lr_scale)

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
        elif self._grads is not None and not self._grads.finite():
            self._diverged(state, f"gradients are non-finite (loss {loss:.4g})")
        elif self.spike_factor:
            if self.losses_seen >= SPIKE_WARMUP and loss > self.spike_factor * self.loss_mean:
                self._diverged(state, f"loss spiked to {loss:.4g}, {loss / self.loss_mean:.1f}x its running mean "
                                      f"{self.loss_mean:.4g} (divergence.spike_factor={self.spike_factor:g})")
                return
            self.loss_mean = loss if self.loss_mean is None else SPIKE_DECAY * self.loss_mean + (1 - SPIKE_DECAY) * loss
            self.losses_seen += 1

    def _diverged(self, state, what: str) -> None:
        where = f"step {state.step + 1} (epoch {state.epoch + 1})"
        state.skip_step = True  # never apply the poisoned gradients
        if self.action == "skip" and self.skipped < self.max_skips:
            self.skipped += 1
            log.warning(f"{what} at {where}; step skipped ({self.skipped}/{self.max_skips})")
            return
        if self.action == "rollback" and self.rollbacks < self.max_rollbacks:
            self._pending = f"{what} at {where}"  # rolled back at the step's end, where the loop can rewind
            return
        also = f" after {self.rollbacks} rollbacks (divergence.max_rollbacks)" if self.action == "rollback" else ""
        log.warning(f"{what} at {where}; stopping{also}. Lower optim.lr, set loop.grad_clip, or check the data")
        state.stop("diverged")

    def on_step_end(self, state):
        if self._pending is not None:
            what, self._pending = self._pending, None
            self._roll_back(state, what)
            return
        if self._agreement is None or "nonfinite_loss" not in self._agreement.poll(state.step):
            return
        what = f"the loss was non-finite on a rank at or before step {state.step} (epoch {state.epoch + 1})"
        if self.action == "skip":
            log.warning(f"{what}; its gradients were finite or skipped by the fp16 grad scaler")
            return
        log.warning(f"{what}; stopping. Lower optim.lr, set loop.grad_clip, or check the data")
        state.stop("diverged")

    def _roll_back(self, state, what: str) -> None:
        found = self._rollback(state) if self._rollback is not None else None
        if found is None:
            log.warning(f"{what}; no checkpoint with finite weights to roll back to; stopping. "
                        "Set checkpoint.every_n_steps, lower optim.lr or set loop.grad_clip")
            state.stop("diverged")
            return
        folder, whole = found
        mine = whole.get("callbacks", {}).get(self.state_key or type(self).__qualname__, {})
        self.loss_mean, self.losses_seen = mine.get("loss_mean"), mine.get("losses_seen", 0)  # as at the checkpoint
        self.rollbacks += 1
        self.lr_scale *= self.lr_factor
        state.counters.rollbacks = self.rollbacks
        state.scheduler.scale("divergence", self.lr_scale)  # the schedule writes the LR (optim.Schedule)
        state.rewound = True
        log.warning(f"{what}; rolled back to {folder} (step {state.step}) with the LR x{self.lr_scale:g} "
                    f"(rollback {self.rollbacks}/{self.max_rollbacks})")

    def on_fit_end(self, state):
        state.counters.skipped_nonfinite_steps = self.skipped
        state.counters.rollbacks = self.rollbacks

    def state_dict(self):
        return {"skipped": self.skipped, "rollbacks": self.rollbacks, "lr_scale": self.lr_scale,
                "loss_mean": self.loss_mean, "losses_seen": self.losses_seen}

    def load_state_dict(self, sd):
        self.skipped, self.rollbacks = sd.get("skipped", 0), sd.get("rollbacks", 0)
        self.lr_scale, self.loss_mean = sd.get("lr_scale", 1.0), sd.get("loss_mean")
        self.losses_seen = sd.get("losses_seen", 0)


def roll_back(state, cbs: CallbackList, augment, manager) -> Optional[tuple[Path, dict]]:
    """Restore the newest checkpoint whose tensors are all finite into the live run, as a resume
    would (checkpoint.snapshot.restore); newer checkpoints holding non-finite tensors are removed (a
    later `--resume auto` must not pick them). Returns (its folder, the restored state) or None."""
    manager.wait()  # a background save in flight is the newest checkpoint
    for folder in list_checkpoints(state.run_dir):
        try:
            tensors, meta = read_checkpoint(folder)
        except CheckpointError as exc:
            log.warning(f"rollback: skipping checkpoint: {exc}")
            continue
        if not all(torch.isfinite(t).all() for t in tensors.values() if t.is_floating_point()):
            log.warning(f"rollback: removing {folder}: it holds non-finite tensors")
            shutil.rmtree(folder, ignore_errors=True)
            continue
        # what measures the run as it really went stays live: time, the ledger, the counters, the guard
        live = CallbackList([cb for cb in cbs.callbacks if not cb.keeps_state_on_rollback])
        counters, seconds = state.counters.state_dict(), state.train_seconds
        whole = restore(state, live, augment, tensors, meta, folder)
        state.counters.load_state_dict(counters)
        state.train_seconds = seconds
        cbs.on_rollback(state)  # the checkpointer saves the restored step again (with the rollback's LR and count)
        return folder, whole
    return None
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
