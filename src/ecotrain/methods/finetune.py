"""Fine-tuning set-up: freeze layers by name or by depth, and discriminative (per-group) learning
rates, through the `param_groups` hook. Start from pre-trained weights with `--init-from`.

    methods:
      - name: finetune
        freeze: ["stem"]                 # parameter-name globs (fnmatch); `stem` also matches `stem.*`
        freeze_depth: 0                  # or: the first N top-level children that hold parameters
        lr_multipliers: {"blocks.0.*": 0.1, "head.*": 10}   # glob -> multiplier of optim.lr; first match wins

A frozen parameter gets `requires_grad=False` and is in no optimizer group (no gradient, no update,
no optimizer state). Freezing a BatchNorm's weight and bias does not stop its running statistics:
that is `methods: [{name: batchnorm, policy: freeze_stats}]`. Every other parameter is trained at
optim.lr times its multiplier (1 when no glob matches); weight decay stays off biases and norms
(parameters with fewer than 2 dims), as in the default groups. A glob that matches no parameter,
a depth beyond the model, or a set-up that leaves nothing to train is a ConfigError naming it.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

from torch import nn

from ecotrain.base.errors import ConfigError
from ecotrain.methods.base import Method


def matches(name: str, pattern: str) -> bool:
    """`pattern` matches the parameter name itself, or names a module the parameter is under."""
    return fnmatchcase(name, pattern) or fnmatchcase(name, pattern + ".*")


def _some(names) -> str:
    names = list(names)
    return ", ".join(names[:8]) + (f", ... ({len(names)} in all)" if len(names) > 8 else "")


class FineTune(Method):
    def __init__(self, cfg, run, trained=None):
        """`cfg`: the method's config (config.FinetuneConfig); `run`: the run's Config (optim.lr, optim.weight_decay)."""
        optim = run.optim
        self.key = "finetune"
        self.freeze, self.freeze_depth = list(cfg.freeze), cfg.freeze_depth
        self.lr_multipliers = dict(cfg.lr_multipliers)
        self.base_lr, self.weight_decay = optim.lr, optim.weight_decay
        self.report: dict = {}

    def frozen_names(self, model: nn.Module) -> set[str]:
        names = [n for n, _ in model.named_parameters()]
        frozen: set[str] = set()
        if self.freeze_depth:
            children = [(n, c) for n, c in model.named_children() if next(c.parameters(), None) is not None]
            if self.freeze_depth > len(children):
                raise ConfigError(f"methods.finetune.freeze_depth: {self.freeze_depth} is more than the model's "
                                  f"{len(children)} top-level children with parameters ({_some(n for n, _ in children)})")
            for n, c in children[:self.freeze_depth]:
                frozen |= {f"{n}.{p}" for p, _ in c.named_parameters()}
        for pattern in self.freeze:
            hit = {n for n in names if matches(n, pattern)}
            if not hit:
                raise ConfigError(f"methods.finetune.freeze: '{pattern}' matches no parameter; names look like "
                                  f"{_some(names)}")
            frozen |= hit
        return frozen

    def param_groups(self, model):
        params = dict(model.named_parameters())
        frozen = self.frozen_names(model)
        for n in frozen:
            params[n].requires_grad_(False)
        trainable = {n: p for n, p in params.items() if p.requires_grad}
        if not trainable:
            raise ConfigError("methods.finetune: every parameter is frozen, so nothing would train; freeze less")
        for pattern in self.lr_multipliers:
            if not any(matches(n, pattern) for n in params):
                raise ConfigError(f"methods.finetune.lr_multipliers: '{pattern}' matches no parameter; names look like "
                                  f"{_some(params)}")
            if not any(matches(n, pattern) for n in trainable):
                raise ConfigError(f"methods.finetune.lr_multipliers: '{pattern}' matches only frozen parameters")
        groups: dict[tuple, dict] = {}  # (pattern, decays) -> group, in order of first appearance
        for n, p in trainable.items():
            pattern = next((g for g in self.lr_multipliers if matches(n, g)), None)
            mult = self.lr_multipliers.get(pattern, 1.0)
            decays = self.weight_decay > 0 and p.ndim >= 2  # none on biases and norm scales
            g = groups.setdefault((pattern, decays), {"params": [], "lr": self.base_lr * mult,
                                                      "weight_decay": self.weight_decay if decays else 0.0})
            g["params"].append(p)
        lr_groups: dict[str, dict] = {}
        for (pattern, _), g in groups.items():
            entry = lr_groups.setdefault(pattern or "(rest)", {"lr_multiplier": self.lr_multipliers.get(pattern, 1.0),
                                                                "lr": g["lr"], "tensors": 0})
            entry["tensors"] += len(g["params"])
        self.report = {
            "frozen_tensors": len(frozen), "trainable_tensors": len(trainable),
            "frozen_parameters": sum(params[n].numel() for n in frozen),
            "trainable_parameters": sum(p.numel() for p in trainable.values()),
            "lr_groups": lr_groups,
        }
        return list(groups.values())

    def summary(self) -> dict:
        return self.report
