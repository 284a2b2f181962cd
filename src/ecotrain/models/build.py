"""Build the configured model: a built-in name, or any nn.Module by import path with kwargs."""

from __future__ import annotations


from torch import nn

from ecotrain.config import ModelConfig
from ecotrain.base.objects import import_object
from ecotrain.base.errors import ConfigError
from ecotrain.models.causal_lm import causal_lm
from ecotrain.models.charlm import CharLM
from ecotrain.models.nanogpt import NanoGPT
from ecotrain.models.vision1d import MLP, ConvBase, ResNet1d, flat_dim
from ecotrain.models.vision2d import Cnn2d


def build_model(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int | None) -> nn.Module:
    n_in = flat_dim(input_shape)
    builtins = {
        "mlp": lambda kw: MLP(n_in, num_classes, dropout=cfg.dropout, **kw),
        "cnn": lambda kw: ConvBase(n_in, num_classes, dropout=cfg.dropout, **kw),
        "resnet": lambda kw: ResNet1d(n_in, num_classes, dropout=cfg.dropout, **kw),
        "cnn2d": lambda kw: Cnn2d(_channels(input_shape), num_classes, dropout=cfg.dropout, **kw),
        "charlm": lambda kw: CharLM(vocab=num_classes or 256, max_len=input_shape[0], dropout=cfg.dropout, **kw),
        "nanogpt": lambda kw: NanoGPT(vocab=_vocab(kw, num_classes) or 256, max_len=kw.pop("max_len", seq_len or 1024),
                                      dropout=cfg.dropout, **kw),
        "causal_lm": lambda kw: causal_lm(vocab_size=_vocab(kw, num_classes), max_len=kw.pop("max_len", seq_len),
                                          dropout=cfg.dropout, **kw),
    }
    seq_len = input_shape[0] if len(input_shape) == 1 else None  # token ids [T]: positions the LM needs
    try:
        if cfg.name in builtins:
            _check_sizes(cfg.name, cfg.kwargs)
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


# A built-in's size keywords: lists of sizes (with the fewest entries each needs), or one size.
_SIZE_LISTS = {"hidden": 0, "widths": 1}
_SIZES = {"channels", "d_model", "n_layers", "n_heads", "mlp_ratio", "n_kv_heads", "d_ff", "max_len", "vocab_size"}


def _channels(shape: tuple[int, ...]) -> int:
    """An image's channels: (C, H, W) has C, (H, W) one; anything else is not an image."""
    if len(shape) == 3:
        return shape[0]
    if len(shape) == 2:
        return 1
    raise ConfigError(f"model cnn2d: takes images shaped (channels, height, width) or (height, width) per sample; "
                      f"the data's samples are shaped {tuple(shape)}")


def _vocab(kwargs: dict, data_vocab: int | None) -> int | None:
    """An LM's vocabulary: the data's, or `vocab_size` when given (no smaller than the data's)."""
    given = kwargs.pop("vocab_size", None)
    if given is not None and data_vocab is not None and given < data_vocab:
        raise ConfigError(f"model.kwargs.vocab_size: {given} is smaller than the data's vocabulary of "
                          f"{data_vocab} tokens; leave it out to use the data's")
    return given if given is not None else data_vocab


def _check_sizes(name: str, kwargs: dict) -> None:
    """hidden=[0] built a layer of no units that trained silently to chance (0 FLOPs), hidden=[-4] failed
    inside torch as `fit failed: RuntimeError`, widths=[] as an IndexError: one line naming the key instead.
    A keyword the model does not take is left to its constructor's TypeError."""
    for key, value in kwargs.items():
        if key in _SIZE_LISTS:
            fewest = _SIZE_LISTS[key]
            if not isinstance(value, (list, tuple)) or len(value) < fewest:
                raise ConfigError(f"model.kwargs.{key}: a list of layer sizes{' (at least one)' if fewest else ''} "
                                  f"for model {name}, e.g. [64, 64]; got {value!r}")
            values = list(value)
        elif key in _SIZES:
            values = [value]
        else:  # not a size (a keyword the model does not take: its constructor's TypeError says so)
            continue
        if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
            raise ConfigError(f"model.kwargs.{key}: sizes of model {name} are whole numbers of 1 or more; got {value!r}")
