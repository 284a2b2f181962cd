"""Training methods under one protocol (base.py); one module per method, built from `methods:`
in the config.

Add a built-in method (two files): its module here, a Method subclass built as `Class(entry, run,
trained)` (base.py), and its section in config/methods.py, a `_Builtin` subclass with `name:
Literal["mine"]` and `impl = "ecotrain.methods.mine:Mine"`; defining the section registers it, and
`build_methods` imports the class only when a recipe names it. A third-party method needs neither:
`methods: [{name: pkg.module:MyMethod, **kwargs}]` (`_user_method`)."""

from __future__ import annotations

import importlib

from ecotrain.config.methods import UserMethodConfig
from ecotrain.base.objects import describe, import_object
from ecotrain.base.errors import ConfigError, DataError
from ecotrain.methods.base import Method, Methods, TrainedRuns


def builtin_class(entry) -> type[Method]:
    """The Method class a built-in section names (`impl`), its module imported now: a run imports
    only the methods its recipe names (and the CLI parses recipes before torch is imported)."""
    module, _, name = type(entry).impl.partition(":")
    return getattr(importlib.import_module(module), name)


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


def build_methods(cfg, extra=(), load_trained=None, read_ledger=None) -> Methods:
    """The config's methods (in order), then any passed by the Python API. `load_trained(path, device)`
    rebuilds a trained run's model (inference.load_trained) and `read_ledger(run)` reads its ledger.json
    (accounting.read_ledger: distill's teacher cost), handed in by whoever builds a run: the methods
    package sits below the code that rebuilds models with methods and below the accounting wing, so it
    imports neither."""
    trained = TrainedRuns(load_trained, read_ledger)
    built = [_user_method(m, f"methods.{i}") if isinstance(m, UserMethodConfig) else builtin_class(m)(m, cfg, trained)
             for i, m in enumerate(cfg.methods)]
    return Methods([*built, *extra])


__all__ = ["Method", "Methods", "TrainedRuns", "build_methods", "builtin_class"]
