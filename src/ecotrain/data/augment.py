"""Seeded augmentation of 1-D signal batches: random circular shift, scale and noise.

It owns its generator so that resuming restores it (see `state_dict`). Under torchrun every rank
draws for the whole global batch and keeps its own rows: the ranks' items get different draws, and
the draws do not depend on the world size (a run resumed on fewer ranks augments alike)."""

from __future__ import annotations

import torch

from ecotrain.config import AugmentConfig


class SignalAugment:
    def __init__(self, cfg: AugmentConfig, seed: int, rank: int = 0, world: int = 1):
        self.cfg, self.rank, self.world = cfg, rank, world
        self.gen = torch.Generator().manual_seed(seed + 7919)

    @property
    def active(self) -> bool:
        return bool(self.cfg.shift or self.cfg.scale or self.cfg.noise)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self.active or not x.is_floating_point():
            return x
        n, g = x.shape[0], self.gen
        length, mine = x.shape[-1], slice(self.rank * n, (self.rank + 1) * n)  # this rank's rows of the global batch
        every = n * self.world
        if self.cfg.shift:
            s = torch.randint(-self.cfg.shift, self.cfg.shift + 1, (every,), generator=g)[mine]
            pos = (torch.arange(length)[None, :] - s[:, None]) % length
            x = x.gather(-1, pos.view(n, *([1] * (x.dim() - 2)), length).expand_as(x))
        if self.cfg.scale:
            k = 1 + (torch.rand(every, generator=g)[mine] * 2 - 1) * self.cfg.scale
            x = x * k.view(n, *([1] * (x.dim() - 1)))
        if self.cfg.noise:
            x = x + torch.randn((every, *x.shape[1:]), generator=g)[mine] * self.cfg.noise
        return x

    def state_dict(self) -> dict:
        return {"gen": self.gen.get_state()}

    def load_state_dict(self, sd: dict) -> None:
        self.gen.set_state(sd["gen"])
