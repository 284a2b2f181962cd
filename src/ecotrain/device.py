"""The run's device: `device: auto | cpu | cuda` in the config made a torch.device. Its own module
so that trainer.py, inference.py and lrfind.py share it without importing one another."""

from __future__ import annotations

import torch

from ecotrain.errors import ConfigError


def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: 'cuda' asked for but no CUDA device is available; use device=auto or cpu")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def same_device(held: torch.device, wanted: torch.device, current: int = 0) -> bool:
    """Whether a tensor on `held` is already on `wanted`. A tensor's device always has an index but
    the run's is plain `cuda` (the current device, `current`): `cuda:0 != cuda` in torch, so a plain
    `!=` is always true and copies every time."""
    def index(d: torch.device) -> int:
        return d.index if d.index is not None else current

    return held.type == wanted.type and index(held) == index(wanted)


def current_index(device: torch.device) -> int:
    """The index that a plain `cuda` stands for (torch.cuda.current_device()); 0 elsewhere."""
    return torch.cuda.current_device() if device.type == "cuda" and device.index is None else 0
