"""The Objective: the task's loss plus every method's named loss terms, normalised once.

Each term, like the task loss, is a mean over the micro-batch's units, so one scale factor (the
micro-batch's share of the effective batch's units) keeps accumulation exactly one big batch
with any term on. A term that does not depend on the batch (a weight penalty) is then counted
once per step, whatever the number of micro-batches.
"""

from __future__ import annotations

from typing import Optional

import torch

from ecotrain.task import normalized_loss


class Objective:
    def __init__(self, task, methods):
        self.task, self.methods = task, methods
        self.has_terms = methods.has_loss_terms

    def __call__(self, model, x, y, total_units: Optional[int], state) -> tuple[torch.Tensor, Optional[dict]]:
        """(loss to backpropagate, {term: detached value} or None). `total_units` None: this
        micro-batch is the whole effective batch."""
        out = model(x)
        loss = normalized_loss(self.task, out, y, total_units)
        if not self.has_terms:  # the common case: nothing else per step
            return loss, None
        terms = self.methods.loss_terms((x, y), out, state)
        share = 1.0 if total_units is None else self.task.units(y) / total_units
        parts = {"task": loss.detach()}
        for name, t in terms.items():
            loss = loss + t * share
            parts[name] = t.detach() * share
        return loss, parts
