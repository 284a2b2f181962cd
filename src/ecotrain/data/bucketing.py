"""Length bucketing for variable-length sequences: batches of similar lengths, so less padding.

`BucketSampler` has EpochSampler's interface and guarantees: epoch e's batches depend only on
(seed, epoch), so the position is just (epoch, batch index) and resuming needs no generator
state. Each epoch: a seeded shuffle, cut into pools of `pool` batches; each pool is sorted by
length and cut into batches; then the order of all batches is shuffled (seeded), so the
lengths a step sees do not drift through the epoch.
"""

from __future__ import annotations

from typing import Iterable, Optional

import torch

from ecotrain.data.sampler import EpochSampler, WindowSampler
from ecotrain.base.errors import ConfigError


class BucketSampler:
    def __init__(self, lengths: torch.Tensor, batch_size: int, seed: int, pool: int = 64):
        self.lengths = torch.as_tensor(lengths)
        self.n, self.batch_size, self.seed, self.pool = len(self.lengths), batch_size, seed, pool

    def __len__(self) -> int:  # as EpochSampler: every batch full but the last
        return (self.n + self.batch_size - 1) // self.batch_size

    def epoch_batches(self, epoch: int) -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        perm = torch.randperm(self.n, generator=g)
        chunk = self.batch_size * self.pool  # a multiple of batch_size: only the last batch is short
        out: list[torch.Tensor] = []
        for c in range(0, self.n, chunk):
            ids = perm[c : c + chunk]
            ids = ids[torch.argsort(self.lengths[ids], descending=True, stable=True)]
            out += ids.split(self.batch_size)
        return [out[i] for i in torch.randperm(len(out), generator=g).tolist()]

    def batches(self, epoch: int, start: int = 0):
        """Index tensors for batches `start, start+1, ...` of `epoch`."""
        yield from self.epoch_batches(epoch)[start:]


def padding_ratio(batches: Iterable[torch.Tensor], lengths: torch.Tensor) -> float:
    """Padding tokens / all tokens when each batch is padded to its longest sequence."""
    pad = total = 0
    for b in batches:
        lens = lengths[b]
        width = int(lens.max()) * len(b)
        pad += width - int(lens.sum())
        total += width
    return pad / total if total else 0.0


def build_sampler(n: int, lengths: Optional[torch.Tensor], batch_size: int, seed: int, bucketing: bool,
                  blocks: Optional[list[int]] = None, window: int = 4096):
    """`blocks`: a streamed source's rows per shard (bundle.extra["blocks"]): shard order + windows."""
    if blocks is not None and not bucketing:
        return WindowSampler(blocks, batch_size, seed, window)
    if not bucketing:
        return EpochSampler(n, batch_size, seed)
    if lengths is None:
        raise ConfigError("data.bucketing: needs variable-length sequences "
                          "(data.name=text with data.kwargs.mode=paragraphs)")
    return BucketSampler(lengths, batch_size, seed)
