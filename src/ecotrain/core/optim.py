"""Optimizer (decoupled weight decay, none on norms and biases; a built-in or any torch.optim.Optimizer
by import path) and LR schedules with warmup."""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

from ecotrain.config import OPTIMIZERS, OptimConfig, ScheduleConfig
from ecotrain.base.objects import describe, import_object
from ecotrain.base.errors import ConfigError, DataError


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
    """The one writer of the LR: each group's lr is base_lr * f(t) * the product of the named scales.
    Lighter than LambdaLR (this runs every step). Whatever else changes the LR asks here, by name:
    `scale("batch_ramp", k)` (methods/batch_ramp.py: the batch-size rule), `scale("divergence", k)`
    (callbacks/divergence.py: a rollback's lower LR); lr-find gives its own f (lrfind.py). The state is
    t and the scales, so a resume sets the same LR. With a user's own scheduler (fit(scheduler=...))
    there is no Schedule: a method or callback that scales the LR is refused in one line
    (`refuse_user_scheduler`), since a scaled LR read back by a chainable torch scheduler would compound."""

    def __init__(self, opt: torch.optim.Optimizer, fn, constant: bool = False):
        self.opt, self.fn, self.t = opt, fn, 0
        self.base_lrs = [g.setdefault("initial_lr", g["lr"]) for g in opt.param_groups]
        self.constant = constant
        self.scales: dict[str, float] = {}  # name -> factor; saved with t
        self._product = 1.0
        self._apply()

    def _apply(self) -> None:
        k = self.fn(self.t) * self._product
        for g, base in zip(self.opt.param_groups, self.base_lrs):
            g["lr"] = base * k

    def scale(self, name: str, factor: float) -> None:
        """The LR times `factor` under `name` from now on (replacing that name's earlier factor; 1 drops it)."""
        if factor == self.scales.get(name, 1.0):
            return
        if factor == 1.0:
            del self.scales[name]
        else:
            self.scales[name] = float(factor)
        self._product = math.prod(self.scales.values())
        self._apply()

    def step(self) -> None:
        self.t += 1
        if not self.constant:
            self._apply()

    def state_dict(self) -> dict:
        return {"t": self.t, "scales": dict(self.scales)}

    def load_state_dict(self, sd: dict) -> None:
        self.t = int(sd["t"])
        self.scales = {str(k): float(v) for k, v in sd.get("scales", {}).items()}  # none before issue 53
        self._product = math.prod(self.scales.values())
        self._apply()


def refuse_user_scheduler(sched, who: list[str]) -> None:
    """One line when something in `who` must scale the LR and the run's scheduler is the user's own."""
    if who and not callable(getattr(sched, "scale", None)):
        raise ConfigError(f"{who[0]}: scales the learning rate through ecotrain's schedule (the schedule: "
                          f"section), and fit(scheduler=...) brings your own {type(sched).__name__}; drop one of "
                          "them, or scale the LR inside your scheduler")


def build_scheduler(opt: torch.optim.Optimizer, cfg: ScheduleConfig, total: int) -> Schedule:
    return Schedule(opt, lr_multiplier(cfg, total), constant=cfg.name == "constant" and cfg.warmup == 0)
