"""A test-only model (loaded by import path) whose loss turns NaN on one rank only."""

import os

from torch import nn


class PoisonOnRank(nn.Module):
    """A linear classifier of digits (64 -> 10) whose logits are NaN at the training forward passes
    listed in `at` (counted from 1), on rank `rank` only (torchrun's RANK)."""

    def __init__(self, at: list[int], rank: int = 1):
        super().__init__()
        self.lin, self.at, self.n = nn.Linear(64, 10), set(at), 0
        self.poisoned = int(os.environ.get("RANK", "0")) == rank

    def forward(self, x):
        out = self.lin(x.flatten(1))
        if self.training:
            self.n += 1
            if self.poisoned and self.n in self.at:
                out = out * float("nan")
        return out
