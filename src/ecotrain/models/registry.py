"""Build the configured model: a built-in name, or any nn.Module by import path with kwargs."""

from __future__ import annotations


from torch import nn

from ecotrain.config import ModelConfig
from ecotrain.data.builtin import import_object
from ecotrain.errors import ConfigError
from ecotrain.models.charlm import CharLM
from ecotrain.models.vision1d import MLP, ConvBase, ResNet1d, flat_dim


def build_model(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int | None) -> nn.Module:
    n_in = flat_dim(input_shape)
    builtins = {
        "mlp": lambda kw: MLP(n_in, num_classes, dropout=cfg.dropout, **kw),
        "cnn": lambda kw: ConvBase(n_in, num_classes, dropout=cfg.dropout, **kw),
        "resnet": lambda kw: ResNet1d(n_in, num_classes, dropout=cfg.dropout, **kw),
        "charlm": lambda kw: CharLM(vocab=num_classes or 256, max_len=input_shape[0], dropout=cfg.dropout, **kw),
    }
    try:
        if cfg.name in builtins:
            return builtins[cfg.name](dict(cfg.kwargs))
    except (TypeError, ValueError) as exc:  # a wrong or impossible keyword, e.g. heads not dividing d_model
        raise ConfigError(f"model.kwargs: {exc}") from None
    cls = import_object(cfg.name, "model.name")
    try:
        model = cls(**cfg.kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"model.kwargs: {exc}") from None
    except Exception as exc:  # the user's class raised while being built: their error, in one line
        raise ConfigError(f"model.name: building '{cfg.name}' raised {type(exc).__name__}: {exc}") from None
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model.name: '{cfg.name}' built a {type(model).__name__}, not a torch.nn.Module")
    return model


