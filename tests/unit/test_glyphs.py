"""The `glyphs` images (data/glyphs.py), the 2-D CNN (models/vision2d.py) and mixed fidelity on images."""

import numpy as np
import pytest
import torch

from ecotrain.base.errors import ConfigError, DataError
from ecotrain.config import load_config
from ecotrain.data.builtin import load_data
from ecotrain.data.glyphs import DEFAULTS, draw, make, options
from ecotrain.methods.resize import resize
from ecotrain.models.build import build_model

RECIPE = "recipes/glyphs_cnn2d.yaml"


def _digits():
    from sklearn import datasets

    d = datasets.load_digits()
    return d.data, d.target


def test_the_images_are_made_the_same_every_time_and_the_test_glyphs_are_held_out():
    x, y = _digits()
    a = make(300, options({"size": 12, "test_samples": 50}, 300), x, y)
    b = make(300, options({"size": 12, "test_samples": 50}, 300), x, y)
    assert all(np.array_equal(a[k], b[k]) for k in a)  # a fixed generator seed: the run's seed picks splits only
    assert a["x_train"].shape == (300, 1, 12, 12) and a["x_test"].shape == (50, 1, 12, 12)
    assert a["x_train"].dtype == np.float32 and set(np.unique(a["y_train"])) <= set(range(10))
    assert np.isfinite(a["x_train"]).all() and a["x_train"].std() > 0.1  # drawn glyphs, not a blank canvas
    src = torch.as_tensor(x[:5], dtype=torch.float32).reshape(-1, 8, 8) / 16
    pick, img = draw(src, 7, {**DEFAULTS, "size": 16, "noise": 0.0}, torch.Generator().manual_seed(0))
    assert img.shape == (7, 1, 16, 16) and int(pick.max()) < 5 and float(img.max()) > 0.3


@pytest.mark.parametrize("kwargs,match", [
    ({"colour": 1}, "not a glyphs option"), ({"size": 4}, "at least 8"), ({"size": 10**6}, "size"),
    ({"size": 16.5}, "whole number"), ({"size": True}, "whole number"), ({"noise": float("nan")}, "finite"),
    ({"noise": -1}, "finite"), ({"rotate": float("inf")}, "finite"), ({"shift": 1.5}, "fractions below 1"),
    ({"test_samples": 0}, "test_samples"), ({"noise": "loud"}, "finite"),
])
def test_bad_options_are_one_line_naming_the_key(kwargs, match):
    with pytest.raises(DataError, match=match):
        options(kwargs, 1000)


def test_a_recipe_of_glyphs_loads_splits_and_trains_a_cnn2d_of_any_size(monkeypatch, tmp_path):
    monkeypatch.setenv("ECOTRAIN_CACHE", str(tmp_path))
    cfg = load_config(RECIPE, ["data.num_samples=400", "data.kwargs.test_samples=60"])
    data = load_data(cfg)
    assert abs(len(data.val) - 80) <= 10 and len(data.val) + len(data.train) == 400 and len(data.test) == 60
    x, _ = data.train.take(torch.arange(4))
    assert tuple(x.shape) == (4, 1, 16, 16)
    model = build_model(cfg.model, tuple(x.shape[1:]), 10)
    assert sum(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules()) == 6
    assert model(x).shape == (4, 10)
    small, y = resize(x, torch.arange(4), 0.5, "downsample")  # mixed fidelity: half the side
    assert tuple(small.shape) == (4, 1, 8, 8) and model(small).shape == (4, 10) and y.tolist() == [0, 1, 2, 3]
    with pytest.raises(ConfigError, match="images shaped"):
        build_model(cfg.model, (64,), 10)
