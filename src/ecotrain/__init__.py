"""ecotrain: train PyTorch models in production.

Public API: `fit`, `Config`, `load_config`, `Callback`, `TrainState`, `RunResult`.
"""

__version__ = "0.1.0"

from ecotrain.callbacks import Callback  # noqa: E402
from ecotrain.config import Config, load_config  # noqa: E402
from ecotrain.errors import EcotrainError  # noqa: E402
from ecotrain.state import TrainState  # noqa: E402
from ecotrain.trainer import RunResult, fit  # noqa: E402

__all__ = ["fit", "Config", "load_config", "Callback", "TrainState", "RunResult", "EcotrainError", "__version__"]
