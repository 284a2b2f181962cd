"""The Objective: the effective batch as a step trains on it, then the task's loss plus every
method's named loss terms, normalised once.

`prepare` runs the methods' `prepare_batch(batch, state) -> batch` on the whole effective batch,
before it is cut into micro-batches (progressive resizing shortens the inputs; selective backprop
keeps the high-loss samples). A method opts in by defining `prepare_batch`; the loop calls it from
one visible line in `train_step`, inside the ledger's measured step, so a scoring forward pass is
counted. What is kept is then accumulated exactly as one big batch.

Each term, like the task loss, is a mean over the micro-batch's units, so one scale factor (the
micro-batch's share of the effective batch's units) keeps accumulation exactly one big batch
with any term on. A term that does not depend on the batch (a weight penalty) is then counted
once per step, whatever the number of micro-batches.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from ecotrain.core.task import normalized_loss


class Objective:
    def __init__(self, task, methods):
        self.task, self.methods = task, methods
        self.xy = getattr(task, "xy", False)  # a built-in supervised task reads an (x, y) pair as model(x), y
        # a method may weight the task loss (distillation: 1 - alpha); the product of every `task_weight`
        self.task_weight = math.prod(float(getattr(m, "task_weight", 1.0)) for m in getattr(methods, "methods", ()))
        self.plain = not methods.has_loss_terms and self.task_weight == 1.0  # the task loss alone
        self.batch_methods = list(getattr(methods, "batch_methods", ()))

    def prepare(self, state, batch):
        """The effective batch after the methods' `prepare_batch`, in config order."""
        for m in self.batch_methods:
            batch = m.prepare_batch(batch, state)
        return batch

    def __call__(self, model, batch, total_units: Optional[int], state,
                 units: Optional[int] = None) -> tuple[torch.Tensor, Optional[dict]]:
        """(loss to backpropagate, {term: detached value} or None). `total_units` None: this
        micro-batch is the whole effective batch; `units`: this micro-batch's count, already read
        (task.unit_counts), else `task.units(batch)`."""
        out = self.task.forward(model, batch)
        if total_units is not None and units is None:
            units = self.task.units(batch)
        loss = normalized_loss(self.task, out, batch, total_units, units)
        if self.plain:  # the common case: nothing else per step
            return loss, None
        terms = self.methods.loss_terms(batch, out, state)
        share = 1.0 if total_units is None else units / total_units
        if self.task_weight != 1.0:
            loss = loss * self.task_weight
        parts = {"task": loss.detach()}
        for name, t in terms.items():
            loss = loss + t * share
            parts[name] = t.detach() * share
        return loss, parts
