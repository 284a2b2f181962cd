"""Built-in models and the registry that builds one from the config."""

from ecotrain.models.build import build_model
from ecotrain.models.vision1d import MLP, ConvBase, ResNet1d

__all__ = ["build_model", "MLP", "ConvBase", "ResNet1d"]
