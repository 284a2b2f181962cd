"""Deterministic, resumable batching: epoch e's order depends only on (seed, epoch).

The position inside an epoch is just the batch index, so resuming needs no generator state and
can never replay or skip a sample.
"""

from __future__ import annotations

import torch


class EpochSampler:
    short_batch_last = True  # only the epoch's last batch may be short (distributed.ShardedSampler seeks by it)

    def __init__(self, n: int, batch_size: int, seed: int):
        self.n, self.batch_size, self.seed = n, batch_size, seed

    def __len__(self) -> int:  # batches per epoch (the last may be short)
        return (self.n + self.batch_size - 1) // self.batch_size

    def order(self, epoch: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.n, generator=g)

    def batches(self, epoch: int, start: int = 0):
        """Index tensors for batches `start, start+1, ...` of `epoch` (views of one permutation)."""
        return self.order(epoch).split(self.batch_size)[start:]


class WindowSampler:
    """For streamed shards (`parquet:PATH`): epoch e reads the blocks (the shards' rows, given as
    row counts in index order) in an order seeded by (seed, e), and shuffles rows within windows of
    `window` consecutive rows of that stream, each seeded by (seed, e, window number). A batch then
    touches a few row groups, the order is still a function of (seed, epoch), and `batches(e, k)`
    starts at batch k by building only the windows from there on."""

    short_batch_last = True

    def __init__(self, blocks: list[int], batch_size: int, seed: int, window: int):
        self.blocks = torch.as_tensor(blocks, dtype=torch.int64)
        self.starts = torch.cumsum(self.blocks, 0) - self.blocks
        self.n, self.batch_size, self.seed = int(self.blocks.sum()), batch_size, seed
        self.window = max(window, batch_size)

    def __len__(self) -> int:
        return (self.n + self.batch_size - 1) // self.batch_size

    def _layout(self, epoch: int):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        perm = torch.randperm(len(self.blocks), generator=g)
        return perm, torch.cumsum(self.blocks[perm], 0)

    def _window(self, epoch: int, k: int, layout) -> torch.Tensor:
        perm, ends = layout
        pos = torch.arange(k * self.window, min((k + 1) * self.window, self.n))
        blk = torch.searchsorted(ends, pos, right=True)  # which block of the stream holds each position
        rows = self.starts[perm[blk]] + pos - (ends[blk] - self.blocks[perm[blk]])
        g = torch.Generator().manual_seed((self.seed * 1_000_003 + epoch) * 1_000_033 + k)
        return rows[torch.randperm(len(rows), generator=g)]

    def order(self, epoch: int) -> torch.Tensor:
        layout = self._layout(epoch)
        return torch.cat([self._window(epoch, k, layout) for k in range(-(-self.n // self.window))])

    def batches(self, epoch: int, start: int = 0):
        """Index tensors for batches `start, start+1, ...` of `epoch`."""
        layout, bs = self._layout(epoch), self.batch_size
        pos = start * bs
        k = pos // self.window
        if pos >= self.n:
            return
        buf = self._window(epoch, k, layout)[pos - k * self.window:]
        while True:
            while len(buf) < bs and (k + 1) * self.window < self.n:
                k += 1
                buf = torch.cat([buf, self._window(epoch, k, layout)])
            if not len(buf):
                return
            yield buf[:bs]
            buf = buf[bs:]
