"""ecotrain: train PyTorch models in production.

Public API: `fit`, `Config`, `load_config`, `Callback`, `TrainState`, `RunResult`, `EcotrainError`.

They are imported on first use (PEP 562 module `__getattr__`), so `import ecotrain` and the command
line's `ecotrain --help` do not import torch; `from ecotrain import fit` does.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ecotrain.base.version import __version__

_LAZY = {  # public name -> the module that defines it
    "fit": "ecotrain.assembly.trainer",
    "RunResult": "ecotrain.assembly.trainer",
    "Config": "ecotrain.config",
    "load_config": "ecotrain.config",
    "Callback": "ecotrain.callbacks",
    "TrainState": "ecotrain.core.state",
    "EcotrainError": "ecotrain.base.errors",
}

__all__ = ["fit", "Config", "load_config", "Callback", "TrainState", "RunResult", "EcotrainError", "__version__"]

if TYPE_CHECKING:  # for type checkers and IDEs; at run time these come from __getattr__
    from ecotrain.callbacks import Callback
    from ecotrain.config import Config, load_config
    from ecotrain.base.errors import EcotrainError
    from ecotrain.core.state import TrainState
    from ecotrain.assembly.trainer import RunResult, fit


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ecotrain' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once imported, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
