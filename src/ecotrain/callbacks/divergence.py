"""Divergence guard: a NaN/Inf loss never trains on silently; it stops the run or skips the step."""

from __future__ import annotations

import sys

from ecotrain.callbacks.base import Callback


class DivergenceGuard(Callback):
    def __init__(self, action: str = "stop", max_skips: int = 10, check_every: int = 1):
        self.action, self.max_skips, self.check_every = action, max_skips, check_every
        self.skipped = 0

    def on_after_backward(self, state):
        if self.check_every > 1 and state.step % self.check_every:
            return
        loss = state.dist.all_reduce_sum(state.loss).item()  # a host sync (and, under DDP, a collective: all
        # ranks must agree to stop); check_every > 1 amortises it
        if loss - loss == 0:  # finite (inf - inf and nan - nan are nan)
            return
        where = f"step {state.step + 1} (epoch {state.epoch + 1})"
        if self.action == "skip" and self.skipped < self.max_skips:
            self.skipped += 1
            state.skip_step = True
            print(f"ecotrain: warning: loss is {loss} at {where}; step skipped "
                  f"({self.skipped}/{self.max_skips})", file=sys.stderr)
            return
        state.skip_step = True  # never apply the poisoned gradients
        print(f"ecotrain: loss is {loss} at {where}; stopping. Lower optim.lr, set loop.grad_clip, "
              f"or check the data", file=sys.stderr)
        state.stop("diverged")

    def on_fit_end(self, state):
        state.extra["skipped_nonfinite_steps"] = self.skipped

    def state_dict(self):
        return {"skipped": self.skipped}

    def load_state_dict(self, sd):
        self.skipped = sd.get("skipped", 0)
