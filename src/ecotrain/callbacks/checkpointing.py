"""Checkpointing policy: every N steps, every few minutes (`every_minutes`, default 10, stretched so
that saving never takes more than ~1% of the time), every epoch, on the best validation metric, on
preemption, and once at the end. Saves happen at the end of a step, after its log line and evaluation, so
a resumed run continues exactly where the saved one stood.

Preemption under torchrun: a signal may reach one rank only, and every rank must stop, and save, at
the same step. The ranks agree at the agreement steps of `distributed.Agreement` (about every
AGREE_SECONDS of training, at most AGREE_MAX_STEPS steps apart, on a schedule every rank computes
identically), not with a collective per step: the job stops at the first agreement step after the
signal. One process stops at the end of the step the signal arrived in."""

from __future__ import annotations

import time

from ecotrain.callbacks.base import Callback
from ecotrain.base.log import log

SAVE_SHARE = 0.01  # periodic saves may take at most this share of the training time


class Checkpointer(Callback):
    after = ("*",)  # it saves what every other callback did this step

    def __init__(self, manager, cfg, capture_fn, preemption=None):
        self.manager, self.cfg, self.capture, self.preemption = manager, cfg, capture_fn, preemption
        self.last_saved_step = -1
        self.last_save_at = time.monotonic()  # the clock of the periodic save (`every_minutes`)
        self.save_seconds = 0.0  # what the latest save took
        self.agreed_at: float | None = None  # when the ranks agreed to stop (a rank the signal missed)

    def due(self) -> bool:
        """A periodic save is due: `every_minutes` since the last one, or longer when a save takes more
        than SAVE_SHARE of that (a large model on a slow disk)."""
        minutes = getattr(self.cfg, "every_minutes", None)
        if not minutes:
            return False
        return time.monotonic() - self.last_save_at >= max(minutes * 60, self.save_seconds / SAVE_SHARE)

    def save(self, state, is_best: bool = False) -> None:
        if state.step == self.last_saved_step and not is_best:
            return
        t = time.monotonic()
        self._save(state, is_best)
        self.last_save_at = time.monotonic()
        self.save_seconds = self.last_save_at - t  # what the loop waited: with background writes, the copy only
        state.counters.checkpoint_blocked_seconds += self.save_seconds

    def _save(self, state, is_best: bool) -> None:
        # every rank captures (gathering RNG states is a collective); copies only for a background writer
        tensors, meta, shards = self.capture(state, self.manager.background)
        if state.dist.is_main or shards is not None:  # DDP: rank 0 writes the (replicated) state
            state.last_checkpoint = str(self.manager.save(state.step, tensors, meta, is_best, shards, state.dist))
        self.last_saved_step = state.step
        if shards is None:  # the others wait for rank 0's write here, not in the next step's collective
            state.dist.barrier()

    def on_step_end(self, state):
        requested = self.preemption is not None and bool(self.preemption.requested)
        due = self.due()
        if state.dist.world_size > 1:  # a signal to any rank stops all ranks, at the next agreement step
            agreement = state.dist.agreement()  # ... and the ranks' clocks differ: a save is agreed too
            if requested:
                agreement.request("preempted")
            if due:
                agreement.request("checkpoint")
            agreed = agreement.poll(state.step)
            requested, due = "preempted" in agreed, "checkpoint" in agreed
            self.agreed_at = time.monotonic() if requested else None
        if requested:
            self.save(state)
            self.manager.wait()  # complete on disk before the process exits
            self.report_notice(state)
            state.stop("preempted")
            return
        n = self.cfg.every_n_steps
        if (n and state.step % n == 0) or due:
            self.save(state)

    def report_notice(self, state) -> None:
        """The seconds from the notice (this rank's, else the agreement) to the complete checkpoint,
        against `preemption.grace_seconds`: a spot machine is gone when the grace ends."""
        noticed = getattr(self.preemption, "noticed_at", None) or self.agreed_at
        state.notice_to_checkpoint_s = round(time.monotonic() - noticed, 3)
        grace = state.config.preemption.grace_seconds
        say = log.warning if state.notice_to_checkpoint_s > grace else log.info
        say(f"preemption: checkpoint {state.last_checkpoint} complete {state.notice_to_checkpoint_s:.2f} s after the "
            f"notice (grace {grace:g} s)" + ("; save more often or on faster storage" if state.notice_to_checkpoint_s > grace
                                             else ""))

    def on_eval_end(self, state, record):
        if self.cfg.on_best and state.best_step == state.step and state.evals_since_best == 0:
            self.save(state, is_best=True)

    def on_epoch_end(self, state):
        if self.cfg.every_epoch:
            self.save(state)

    def on_rollback(self, state):
        self.last_saved_step = -1  # a run killed right after it resumes as the uninterrupted one goes on

    def on_fit_end(self, state):
        if state.stopped_because != "preempted" and self.cfg.at_end:
            self.save(state)
        self.manager.wait()

    def on_exception(self, state, exc):
        try:
            self.manager.wait()
        except Exception:
            pass  # the original exception is the one to report

    def state_dict(self):
        return {"best": str(self.manager.best) if self.manager.best else None}

    def load_state_dict(self, sd):
        from pathlib import Path
        self.manager.best = Path(sd["best"]) if sd.get("best") else None
