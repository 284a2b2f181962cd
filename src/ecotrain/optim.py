"""Optimizer (decoupled weight decay, none on norms and biases) and LR schedules with warmup."""

from __future__ import annotations

import math

import torch
from torch import nn

from ecotrain.config import OptimConfig, ScheduleConfig


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)  # ndim<2: biases and norm scales
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer:
    groups = param_groups(model, cfg.weight_decay)
    if cfg.name == "adamw":
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas)
    if cfg.name == "adam":  # Adam's decay is L2 in the gradient; AdamW's is decoupled
        return torch.optim.Adam(groups, lr=cfg.lr, betas=cfg.betas)
    return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum)


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


def build_scheduler(opt: torch.optim.Optimizer, cfg: ScheduleConfig, total: int):
    return torch.optim.lr_scheduler.LambdaLR(opt, lr_multiplier(cfg, total))
