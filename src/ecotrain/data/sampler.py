"""Deterministic, resumable batching: epoch e's order depends only on (seed, epoch).

The position inside an epoch is just the batch index, so resuming needs no generator state and
can never replay or skip a sample.
"""

from __future__ import annotations

import torch


class EpochSampler:
    def __init__(self, n: int, batch_size: int, seed: int):
        self.n, self.batch_size, self.seed = n, batch_size, seed

    def __len__(self) -> int:  # batches per epoch (the last may be short)
        return (self.n + self.batch_size - 1) // self.batch_size

    def order(self, epoch: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.n, generator=g)

    def batches(self, epoch: int, start: int = 0):
        """Index tensors for batches `start, start+1, ...` of `epoch`."""
        order = self.order(epoch)
        for b in range(start, len(self)):
            yield order[b * self.batch_size : (b + 1) * self.batch_size]
