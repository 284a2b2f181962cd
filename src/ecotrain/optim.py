"""Optimizer (decoupled weight decay, none on norms and biases; a built-in or any torch.optim.Optimizer
by import path) and LR schedules with warmup."""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

from ecotrain.config import OPTIMIZERS, OptimConfig, ScheduleConfig
from ecotrain.data.builtin import describe, import_object
from ecotrain.errors import ConfigError, DataError


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    if weight_decay == 0:  # one group: the optimizer's per-group overhead is paid every step
        return [{"params": [p for p in model.parameters() if p.requires_grad], "weight_decay": 0.0}]
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)  # ndim<2: biases and norm scales
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def _impl(cfg: OptimConfig, model: nn.Module) -> dict:
    impl = cfg.implementation
    if impl == "auto":
        devices = {p.device.type for p in model.parameters()}
        floats = all(p.dtype in (torch.float32, torch.float16, torch.bfloat16) for p in model.parameters())
        impl = "fused" if floats and devices <= {"cpu", "cuda"} else "for-loop"
    return {"fused": {"fused": True}, "foreach": {"foreach": True}, "for-loop": {"foreach": False}}[impl]


def build_optimizer(model: nn.Module, cfg: OptimConfig, groups: list[dict] | None = None,
                    factory: Callable[[list[dict]], torch.optim.Optimizer] | None = None) -> torch.optim.Optimizer:
    """`groups`: a method's parameter groups (freezing, per-group LR); each group without its own
    `weight_decay` gets optim.weight_decay. None: the default groups below. `factory` (the Python API):
    called with those groups, it builds the optimizer instead of optim.name."""
    if groups is None:
        groups = param_groups(model, cfg.weight_decay)
    else:
        groups = [{"weight_decay": cfg.weight_decay, **g} for g in groups]
    if factory is not None:
        opt = factory(groups)
        if not isinstance(opt, torch.optim.Optimizer):
            raise TypeError(f"the optimizer factory returned {type(opt).__name__}, not a torch.optim.Optimizer")
        return opt
    if cfg.name not in OPTIMIZERS:
        return _import_path_optimizer(cfg, groups)
    if cfg.name == "adamw":
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, **_impl(cfg, model))
    if cfg.name == "adam":  # Adam's decay is L2 in the gradient; AdamW's is decoupled
        return torch.optim.Adam(groups, lr=cfg.lr, betas=cfg.betas, **_impl(cfg, model))
    impl = _impl(cfg, model)
    return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, **({} if "fused" in impl else impl))


def _import_path_optimizer(cfg: OptimConfig, groups: list[dict]) -> torch.optim.Optimizer:
    """optim.name `pkg.module:Class`: lr rides in every group (a method's own group lr wins), so the
    class needs no `lr` argument; optim.kwargs are its other arguments."""
    hint = "; optim.name takes adamw, adam, sgd or a torch.optim.Optimizer subclass, e.g. 'torch.optim:RAdam'"
    try:
        cls = import_object(cfg.name, "optim.name")
    except DataError as exc:
        raise ConfigError(f"{exc}{hint}") from None
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
        raise ConfigError(f"optim.name: '{cfg.name}' is {_what(cls)}, not a torch.optim.Optimizer subclass{hint}")
    try:
        return cls([{"lr": cfg.lr, **g} for g in groups], **cfg.kwargs)
    except TypeError as exc:
        raise ConfigError(f"optim.name: {cfg.name} refused optim.kwargs {cfg.kwargs} ({describe(exc)}); "
                          "give the arguments its constructor takes") from None
    except Exception as exc:  # the class's own argument checks (a negative eps, betas out of range)
        raise ConfigError(f"optim.name: building {cfg.name} with optim.kwargs {cfg.kwargs} raised "
                          f"{describe(exc)}; fix optim.kwargs") from None


def _what(obj) -> str:
    return f"the class {obj.__name__}" if isinstance(obj, type) else f"a {type(obj).__name__}"


def lr_multiplier(cfg: ScheduleConfig, total: int):
    """f(t) -> factor of the base LR at interval t (steps or epochs), `total` intervals in all."""
    warm = cfg.warmup
    floor = cfg.min_lr_ratio

    def cosine(frac: float) -> float:
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))

    def f(t: int) -> float:
        if t < warm:
            return (t + 1) / (warm + 1)
        if cfg.name == "constant":
            return 1.0
        if cfg.name == "step":
            return cfg.gamma ** ((t - warm) // cfg.step_size)
        if cfg.name == "cosine":
            return cosine((t - warm) / max(1, total - warm))
        peak = max(warm, int(cfg.pct_start * total))  # onecycle: rise to the peak, then anneal
        if t < peak:
            return floor + (1 - floor) * (t + 1) / (peak + 1)
        return cosine((t - peak) / max(1, total - peak))

    return f


class Schedule:
    """Sets each group's lr to base_lr * f(t). Lighter than LambdaLR (this runs every step) and
    its whole state is one integer."""

    def __init__(self, opt: torch.optim.Optimizer, fn, constant: bool = False):
        self.opt, self.fn, self.t = opt, fn, 0
        self.base_lrs = [g.setdefault("initial_lr", g["lr"]) for g in opt.param_groups]
        self.constant = constant
        self._apply()

    def _apply(self) -> None:
        k = self.fn(self.t)
        for g, base in zip(self.opt.param_groups, self.base_lrs):
            g["lr"] = base * k

    def step(self) -> None:
        self.t += 1
        if not self.constant:
            self._apply()

    def state_dict(self) -> dict:
        return {"t": self.t}

    def load_state_dict(self, sd: dict) -> None:
        self.t = int(sd["t"])
        self._apply()


def build_scheduler(opt: torch.optim.Optimizer, cfg: ScheduleConfig, total: int) -> Schedule:
    return Schedule(opt, lr_multiplier(cfg, total), constant=cfg.name == "constant" and cfg.warmup == 0)
