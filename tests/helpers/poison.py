"""A test-only model (loaded by import path) whose loss turns NaN on one rank only."""

import os

import torch
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


class OomOnRank(nn.Module):
    """A linear classifier of digits whose training forward raises CUDA's OutOfMemoryError at the
    forward pass `at` (counted from 1) on rank `rank`, in torchrun's first attempt only, and not when
    its micro-batch is at most `fits` samples."""

    def __init__(self, at: int, rank: int = 1, fits: int = 16):
        super().__init__()
        self.lin, self.at, self.fits, self.n = nn.Linear(64, 10), at, fits, 0
        first = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        self.armed = first and int(os.environ.get("RANK", "0")) == rank

    def forward(self, x):
        if self.training:
            self.n += 1
            if self.armed and self.n >= self.at and x.shape[0] > self.fits:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
        return self.lin(x.flatten(1))
