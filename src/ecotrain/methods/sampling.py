"""Helpers for the data methods' samplers (dedup, curriculum, batch ramp): every sampler they
build keeps the engine's contract, `batches(epoch, start)` a pure function of (seed, epoch, the
method's state), so a resume at a batch index replays nothing and skips nothing."""

from __future__ import annotations

import torch

from ecotrain.data.bucketing import BucketSampler
from ecotrain.data.sampler import EpochSampler
from ecotrain.base.errors import ConfigError


def epoch_order(sampler, epoch: int) -> torch.Tensor:
    """All of epoch `epoch`'s indices, in the order `sampler` yields them."""
    if hasattr(sampler, "epoch_order"):
        return sampler.epoch_order(epoch)
    if isinstance(sampler, EpochSampler):
        return sampler.order(epoch)
    return torch.cat(list(sampler.batches(epoch)))


def generator(seed: int, epoch: int, salt: int) -> torch.Generator:
    """A generator of its own per (seed, epoch, method): never the sampler's stream."""
    return torch.Generator().manual_seed((seed * 1_000_003 + epoch) * 101 + salt)


def over_subset(sampler, keep: torch.Tensor, who: str):
    """The same kind of sampler over `len(keep)` samples (the kept ones, renumbered 0..k-1)."""
    if isinstance(sampler, EpochSampler):
        return EpochSampler(len(keep), sampler.batch_size, sampler.seed)
    if isinstance(sampler, BucketSampler):
        return BucketSampler(sampler.lengths[keep], sampler.batch_size, sampler.seed, sampler.pool)
    raise ConfigError(f"methods.{who}: needs the engine's shuffled or length-bucketed order (got a "
                      f"{type(sampler).__name__}: a streamed source, or a method listed before it); "
                      f"list {who} first under methods:, over in-memory or map-style data")


def plain(sampler, who: str):
    """Refuse a sampler whose batches are not plain cuts of one order (length bucketing)."""
    if isinstance(sampler, BucketSampler):
        raise ConfigError(f"methods.{who}: not with data.bucketing (its batches group lengths, an order of "
                          "its own); turn bucketing off or drop the method")
    return sampler
