"""Training methods under one protocol (base.py); one module per method, built from `methods:`
in the config. Add a method: its config class in config.py (`MethodConfig`), its module here,
one line in BUILDERS."""

from __future__ import annotations

from ecotrain.methods.base import Method, Methods


# Each builder takes (its own config entry, the run's whole Config) and imports its module lazily.
def _ema(m, run):
    from ecotrain.methods.ema import EMA
    return EMA(m, run.distributed.strategy)


def _batchnorm(m, run):
    from ecotrain.methods.batchnorm import BatchNormPolicy
    return BatchNormPolicy(m, run.distributed.strategy)


def _finetune(m, run):
    from ecotrain.methods.finetune import FineTune
    return FineTune(m, run.optim)  # its groups need optim.lr and optim.weight_decay


BUILDERS = {"ema": _ema, "batchnorm": _batchnorm, "finetune": _finetune}


def build_methods(cfg, extra=()) -> Methods:
    """The config's methods (in order), then any passed by the Python API."""
    return Methods([*(BUILDERS[m.name](m, cfg) for m in cfg.methods), *extra])


__all__ = ["Method", "Methods", "build_methods", "BUILDERS"]
