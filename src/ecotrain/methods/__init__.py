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


def _dedup(m, run):
    from ecotrain.methods.dedup import Dedup
    return Dedup(m)


def _curriculum(m, run):
    from ecotrain.methods.curriculum import Curriculum
    return Curriculum(m)


def _selective(m, run):
    from ecotrain.methods.selective import SelectiveBackprop
    return SelectiveBackprop(m)


def _resize(m, run):
    from ecotrain.methods.resize import ProgressiveResize
    return ProgressiveResize(m)


def _batch_ramp(m, run):
    from ecotrain.methods.batch_ramp import BatchRamp
    return BatchRamp(m, run)  # the full batch size, the step budget, the strategy


def _late_freeze(m, run):
    from ecotrain.methods.late_freeze import LateFreeze
    return LateFreeze(m, run)


def _stability(m, run):
    from ecotrain.methods.stability import StabilityStop
    return StabilityStop(m)


def _distill(m, run):
    from ecotrain.methods.distill import Distill
    return Distill(m, run)  # refuses cache with augmentation or loader workers


def _prune(m, run):
    from ecotrain.methods.prune import Prune
    return Prune(m, run)


def _qat(m, run):
    from ecotrain.methods.qat import QAT
    return QAT(m, run)


def _replay(m, run):
    from ecotrain.methods.replay import Replay
    return Replay(m, run)


def _ewc(m, run):
    from ecotrain.methods.ewc import EWC
    return EWC(m, run)


def _lwf(m, run):
    from ecotrain.methods.lwf import LwF
    return LwF(m, run)


def _adapters(m, run):
    from ecotrain.methods.adapters import Adapters
    return Adapters(m, run)  # imports PEFT (and transformers) only when used


BUILDERS = {"replay": _replay, "ewc": _ewc, "lwf": _lwf, "adapters": _adapters, "ema": _ema, "batchnorm": _batchnorm, "finetune": _finetune, "dedup": _dedup, "curriculum": _curriculum,
            "selective_backprop": _selective, "progressive_resize": _resize, "batch_ramp": _batch_ramp,
            "late_freeze": _late_freeze, "stability_stop": _stability,
            "distill": _distill, "prune": _prune, "qat": _qat}


def build_methods(cfg, extra=()) -> Methods:
    """The config's methods (in order), then any passed by the Python API."""
    return Methods([*(BUILDERS[m.name](m, cfg) for m in cfg.methods), *extra])


__all__ = ["Method", "Methods", "build_methods", "BUILDERS"]
