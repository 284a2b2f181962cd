"""Seeded augmentation of 1-D signal batches: random circular shift, scale and noise.

It owns its generator so that resuming restores it (see `state_dict`)."""

from __future__ import annotations

import torch

from ecotrain.config import AugmentConfig


class SignalAugment:
    def __init__(self, cfg: AugmentConfig, seed: int):
        self.cfg = cfg
        self.gen = torch.Generator().manual_seed(seed + 7919)

    @property
    def active(self) -> bool:
        return bool(self.cfg.shift or self.cfg.scale or self.cfg.noise)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self.active or not x.is_floating_point():
            return x
        n, g = x.shape[0], self.gen
        length = x.shape[-1]
        if self.cfg.shift:
            s = torch.randint(-self.cfg.shift, self.cfg.shift + 1, (n,), generator=g)
            pos = (torch.arange(length)[None, :] - s[:, None]) % length
            x = x.gather(-1, pos.view(n, *([1] * (x.dim() - 2)), length).expand_as(x))
        if self.cfg.scale:
            k = 1 + (torch.rand(n, generator=g) * 2 - 1) * self.cfg.scale
            x = x * k.view(n, *([1] * (x.dim() - 1)))
        if self.cfg.noise:
            x = x + torch.randn(x.shape, generator=g) * self.cfg.noise
        return x

    def state_dict(self) -> dict:
        return {"gen": self.gen.get_state()}

    def load_state_dict(self, sd: dict) -> None:
        self.gen.set_state(sd["gen"])
