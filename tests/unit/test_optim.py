"""optim.name: the built-ins, any torch.optim.Optimizer by import path, and a Python-API factory."""

import pytest
import torch
from torch import nn

from ecotrain import fit
from ecotrain.config import OptimConfig, load_config
from ecotrain.base.errors import ConfigError
from ecotrain.core.optim import build_optimizer


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 4), nn.LayerNorm(4), nn.Linear(4, 2))


def test_an_import_path_builds_that_optimizer_with_lr_and_decay_in_the_groups():
    cfg = OptimConfig(name="torch.optim:RAdam", lr=0.01, weight_decay=0.1, kwargs={"eps": 1e-6})
    opt = build_optimizer(_model(), cfg)
    assert type(opt) is torch.optim.RAdam
    assert [(g["lr"], g["weight_decay"], g["eps"]) for g in opt.param_groups] == [(0.01, 0.1, 1e-6), (0.01, 0.0, 1e-6)]
    assert [len(g["params"]) for g in opt.param_groups] == [2, 4]  # matrices decay; biases and norm scales do not


def test_a_methods_groups_keep_their_own_lr_under_an_import_path():
    model = _model()
    groups = [{"params": list(model[0].parameters()), "lr": 0.5}, {"params": list(model[2].parameters())}]
    opt = build_optimizer(model, OptimConfig(name="torch.optim:Adagrad", lr=0.01, weight_decay=0.1), groups)
    assert [(g["lr"], g["weight_decay"]) for g in opt.param_groups] == [(0.5, 0.1), (0.01, 0.1)]


@pytest.mark.parametrize("name", ["sgd", "torch.optim:RAdam"])
def test_a_factory_gets_the_same_groups_and_wins_over_the_name(name):
    seen = []

    def factory(groups):
        seen.append(groups)
        return torch.optim.SGD(groups, lr=0.2)

    opt = build_optimizer(_model(), OptimConfig(name=name, weight_decay=0.1), factory=factory)
    assert type(opt) is torch.optim.SGD and opt.param_groups[0]["lr"] == 0.2
    assert [g["weight_decay"] for g in seen[0]] == [0.1, 0.0]
    with pytest.raises(TypeError, match="returned list, not a torch.optim.Optimizer"):
        build_optimizer(_model(), OptimConfig(name=name), factory=lambda groups: groups)


@pytest.mark.parametrize("name, kwargs, words", [
    ("torch.optim_nope:RAdam", {}, ["optim.name", "cannot import", "e.g. 'torch.optim:RAdam'"]),
    ("torch.optim:RAdamm", {}, ["optim.name", "has no attribute 'RAdamm'", "torch.optim.Optimizer subclass"]),
    ("torch.nn:Linear", {}, ["optim.name", "the class Linear, not a torch.optim.Optimizer subclass"]),
    ("math:pi", {}, ["optim.name", "a float, not a torch.optim.Optimizer subclass"]),
    ("torch.optim:RAdam", {"epss": 1}, ["optim.name", "refused optim.kwargs", "'epss'", "arguments its constructor takes"]),
    ("torch.optim:RAdam", {"eps": -1.0}, ["optim.name", "ValueError", "eps", "fix optim.kwargs"]),
])
def test_a_bad_import_path_optimizer_is_one_config_error_line(name, kwargs, words):
    with pytest.raises(ConfigError) as e:
        build_optimizer(_model(), OptimConfig(name=name, kwargs=kwargs))
    msg = str(e.value)
    assert all(w in msg for w in words) and "\n" not in msg, msg


@pytest.mark.parametrize("overrides, words", [
    (["optim.name=adamx"], ["'optim.name'", "adamw, adam, sgd", "pkg.module:Class", "(got 'adamx')"]),
    (["optim.name=':RAdam'"], ["'optim.name'", "adamw, adam, sgd"]),
    (["optim.kwargs={eps: 1.0e-6}"], ["'optim.kwargs'", "import-path optimizer", "adamw is set by optim.betas"]),
    (["optim.name=torch.optim:RAdam", "optim.kwargs={lr: 0.1}"], ["'optim.kwargs'", "set optim.lr"]),
    (["optim.name=torch.optim:RAdam", "optim.kwargs={weight_decay: 0.1}"], ["'optim.kwargs'", "set optim.weight_decay"]),
])
def test_optim_config_errors_name_the_key(overrides, words):
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    msg = str(e.value)
    assert all(w in msg for w in words) and "\n" not in msg, msg


def test_fit_trains_with_an_import_path_optimizer(tiny_cfg, tmp_path):
    cfg = tiny_cfg(**{"optim.name": "torch.optim:NAdam", "optim.kwargs": {"momentum_decay": 0.004}})
    r = fit(cfg, run_dir=tmp_path / "r", quiet=True)
    assert type(r.state.optimizer) is torch.optim.NAdam and r.state.optimizer.param_groups[0]["momentum_decay"] == 0.004
    assert r.summary["test_accuracy"] > 0.5  # digits, 60 steps: it learned
