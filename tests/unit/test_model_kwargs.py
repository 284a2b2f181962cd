"""A built-in model's size keywords (models/build.py `_check_sizes`): one line naming the key, before
any layer is built. hidden=[0] trained silently to chance, hidden=[-4] ended as `fit failed: RuntimeError`
(exit 1), widths=[] as an IndexError."""

import pytest
import torch

from ecotrain.config import ModelConfig
from ecotrain.base.errors import ConfigError
from ecotrain.models.build import build_model


@pytest.mark.parametrize("name, kwargs, words", [
    ("mlp", {"hidden": [0]}, "model.kwargs.hidden: sizes of model mlp are whole numbers of 1 or more; got [0]"),
    ("mlp", {"hidden": [16, -4]}, "model.kwargs.hidden: sizes of model mlp are whole numbers"),
    ("mlp", {"hidden": [2.5]}, "model.kwargs.hidden"),
    ("mlp", {"hidden": 16}, "model.kwargs.hidden: a list of layer sizes for model mlp, e.g. [64, 64]; got 16"),
    ("resnet", {"widths": []}, "model.kwargs.widths: a list of layer sizes (at least one)"),
    ("cnn", {"channels": 0}, "model.kwargs.channels: sizes of model cnn"),
    ("charlm", {"n_heads": True}, "model.kwargs.n_heads"),
])
def test_bad_sizes_are_one_line(name, kwargs, words):
    with pytest.raises(ConfigError) as err:
        build_model(ModelConfig(name=name, kwargs=kwargs), (64,), 10)
    assert words in str(err.value), str(err.value)


def test_good_sizes_build():
    assert build_model(ModelConfig(name="mlp", kwargs={"hidden": []}), (64,), 10)(torch.zeros(2, 64)).shape == (2, 10)
    build_model(ModelConfig(name="resnet", kwargs={"widths": [4, 8]}), (40,), 3)
    with pytest.raises(ConfigError, match="unexpected keyword argument 'bogus'"):  # left to the constructor
        build_model(ModelConfig(name="mlp", kwargs={"bogus": 1}), (64,), 10)
