"""Training methods under one protocol (base.py); one module per method, built from `methods:`
in the config. Add a method: its config class in config_methods.py (`MethodConfig`), its module
here, one line in BUILDERS. A third-party method needs none of these: `methods: [{name:
pkg.module:MyMethod, **kwargs}]` (`_user_method`)."""

from __future__ import annotations

from ecotrain.config_methods import UserMethodConfig
from ecotrain.data.builtin import describe, import_object
from ecotrain.errors import ConfigError, DataError
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


def _curriculum(m, run, load_trained=None):
    from ecotrain.methods.curriculum import Curriculum
    return Curriculum(m, load_trained)


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


def _distill(m, run, load_trained=None, read_ledger=None):
    from ecotrain.methods.distill import Distill
    return Distill(m, run, load_trained, read_ledger)  # refuses cache with augmentation or loader workers


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


def _average(m, run):
    from ecotrain.methods.average import Average
    return Average(m, run)


def _adapters(m, run):
    from ecotrain.methods.adapters import Adapters
    return Adapters(m, run)  # imports PEFT (and transformers) only when used


BUILDERS = {"replay": _replay, "ewc": _ewc, "lwf": _lwf, "adapters": _adapters, "average": _average, "ema": _ema, "batchnorm": _batchnorm, "finetune": _finetune, "dedup": _dedup, "curriculum": _curriculum,
            "selective_backprop": _selective, "progressive_resize": _resize, "batch_ramp": _batch_ramp,
            "late_freeze": _late_freeze, "stability_stop": _stability,
            "distill": _distill, "prune": _prune, "qat": _qat}


def _user_method(m: UserMethodConfig, where: str) -> Method:
    """`{name: pkg.module:MyMethod, **kwargs}`: a Method subclass (or a factory returning a Method)
    called with the entry's other keys. `where`: the entry's key in errors (`methods.0`)."""
    try:
        obj = import_object(m.name, f"{where}.name")
    except DataError as exc:
        raise ConfigError(f"{exc}; name an ecotrain Method subclass, e.g. 'mypkg.methods:MyMethod'") from None
    try:
        method = obj(**m.kwargs)
    except Exception as exc:  # the user's constructor: a wrong keyword, its own checks
        raise ConfigError(f"{where}: building '{m.name}' with {m.kwargs} raised {describe(exc)}; the entry's keys "
                          "other than name are its keyword arguments") from None
    if not isinstance(method, Method):
        raise ConfigError(f"{where}: '{m.name}' gave a {type(method).__name__}, not an ecotrain Method; "
                          "subclass ecotrain.methods.Method")
    if not method.key:  # its checkpoint state needs a stable name; a callback's default is its class name too
        method.key = type(method).__qualname__
    return method


NEEDS_TRAINED = ("curriculum", "distill")  # builders that take `load_trained` (a reference or teacher run)


def build_methods(cfg, extra=(), load_trained=None, read_ledger=None) -> Methods:
    """The config's methods (in order), then any passed by the Python API. `load_trained(path, device)`
    rebuilds a trained run's model (inference.load_trained) and `read_ledger(run)` reads its ledger.json
    (accounting.read_ledger: distill's teacher cost), handed in by whoever builds a run: the methods
    package sits below the code that rebuilds models with methods and below the accounting wing, so it
    imports neither."""
    handed = {"curriculum": (load_trained,), "distill": (load_trained, read_ledger)}
    built = [_user_method(m, f"methods.{i}") if isinstance(m, UserMethodConfig)
             else BUILDERS[m.name](m, cfg, *handed[m.name]) if m.name in NEEDS_TRAINED else BUILDERS[m.name](m, cfg)
             for i, m in enumerate(cfg.methods)]
    return Methods([*built, *extra])


__all__ = ["Method", "Methods", "build_methods", "BUILDERS"]
