"""Training methods under one protocol (base.py); one module per method, built from `methods:`
in the config. Add a method: its config class in config.py (`MethodConfig`), its module here,
one line in BUILDERS."""

from __future__ import annotations

from ecotrain.methods.base import Method, Methods


def _ema(cfg, strategy):
    from ecotrain.methods.ema import EMA
    return EMA(cfg, strategy)


BUILDERS = {"ema": _ema}


def build_methods(cfg, extra=()) -> Methods:
    """The config's methods (in order), then any passed by the Python API."""
    strategy = cfg.distributed.strategy
    return Methods([*(BUILDERS[m.name](m, strategy) for m in cfg.methods), *extra])


__all__ = ["Method", "Methods", "build_methods", "BUILDERS"]
