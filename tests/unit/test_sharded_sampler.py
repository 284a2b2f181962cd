"""ShardedSampler: under DDP every rank steps on an equal, non-empty share of each global batch,
and the short batch is the one dropped, wherever the base sampler puts it (BucketSampler shuffles
the order of its batches, so the short one may come first)."""

import pytest
import torch

from ecotrain.data.bucketing import BucketSampler
from ecotrain.data.sampler import EpochSampler
from ecotrain.core.distributed import ShardedSampler


def _lengths(n):
    g = torch.Generator().manual_seed(0)
    return (torch.rand(n, generator=g) ** 3 * 500).long() + 1


def _short_position(base, epoch):
    sizes = [len(b) for b in base.batches(epoch)]
    return next(i for i, s in enumerate(sizes) if s < base.batch_size), len(sizes)


@pytest.mark.parametrize("world", [2, 4])
def test_bucketed_shards_are_equal_and_drop_the_short_batch_wherever_it_falls(world):
    n, bs = 1000, 32  # 31 full batches and one of 8
    base = BucketSampler(_lengths(n), bs, seed=0)
    positions = set()
    for epoch in range(6):
        short, count = _short_position(base, epoch)
        positions.add(short)
        full = [b for b in base.batches(epoch) if len(b) == bs]
        shards = [list(ShardedSampler(base, r, world).batches(epoch)) for r in range(world)]
        for r, shard in enumerate(shards):
            assert len(shard) == len(ShardedSampler(base, r, world)) == n // bs
            assert all(len(b) == bs // world for b in shard)  # equal and non-empty, every step
        for step in range(n // bs):  # together the ranks cover exactly each full global batch
            assert torch.cat([s[step] for s in shards]).tolist() == full[step].tolist()
    assert any(p < count - 1 for p in positions)  # the short batch was not always last


def test_resuming_mid_epoch_continues_the_same_shards():
    base = BucketSampler(_lengths(1000), 32, seed=3)
    for epoch in range(4):
        s = ShardedSampler(base, 1, 2)
        whole = [b.tolist() for b in s.batches(epoch)]
        for start in (0, 1, 7, 30, 31):
            assert [b.tolist() for b in s.batches(epoch, start)] == whole[start:]


def test_epoch_sampler_shards_unchanged():
    base = EpochSampler(103, 10, seed=0)
    s = ShardedSampler(base, 0, 2)
    got = [b.tolist() for b in s.batches(0)]
    order = base.order(0)
    assert got == [order[i * 10 : i * 10 + 5].tolist() for i in range(10)]
    assert [b.tolist() for b in s.batches(0, 4)] == got[4:]
