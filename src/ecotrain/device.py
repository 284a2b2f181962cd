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
