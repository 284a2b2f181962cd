"""Training methods under one protocol (base.py); one module per method, built from `methods:`
in the config. Add a method: its config class in config.py (`MethodConfig`), its module here,
one line in BUILDERS."""

from __future__ import annotations

from ecotrain.methods.base import Method, Methods


def _ema(cfg, strategy):
    from ecotrain.methods.ema import EMA
    return EMA(cfg, strategy)


def _batchnorm(cfg, strategy):
    from ecotrain.methods.batchnorm import BatchNormPolicy
    return BatchNormPolicy(cfg, strategy)


def _finetune(cfg, strategy, run):
    from ecotrain.methods.finetune import FineTune
    return FineTune(cfg, run.optim)


BUILDERS = {"ema": _ema, "batchnorm": _batchnorm, "finetune": _finetune}
NEEDS_RUN = {"finetune"}  # builders that also take the run's whole Config (finetune: optim.lr, optim.weight_decay)


def build_methods(cfg, extra=()) -> Methods:
    """The config's methods (in order), then any passed by the Python API."""
    strategy = cfg.distributed.strategy
    return Methods([*(BUILDERS[m.name](m, strategy, *((cfg,) if m.name in NEEDS_RUN else ())) for m in cfg.methods),
                    *extra])


__all__ = ["Method", "Methods", "build_methods", "BUILDERS"]
