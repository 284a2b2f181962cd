"""methods/finetune.py: freezing by name pattern or depth, per-group learning rates through
`param_groups`, clear errors for patterns that match nothing, exact resume."""

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from ecotrain import fit
from ecotrain.config import Config, FinetuneConfig
from ecotrain.base.errors import ConfigError
from ecotrain.methods.finetune import FineTune
from ecotrain.models import ResNet1d
from tests.unit.test_methods import SigtermAt


def _ft(**kw):
    return {"methods": [{"name": "finetune", **kw}]}


def groups_of(model, lr=1e-3, weight_decay=0.0, **kw):
    m = FineTune(FinetuneConfig(name="finetune", **kw), Config.model_validate({"optim": {"lr": lr, "weight_decay": weight_decay}}))
    return m, m.param_groups(model)


def names_in(model, group) -> set[str]:
    ids = {id(p) for p in group["params"]}
    return {n for n, p in model.named_parameters() if id(p) in ids}


def test_freeze_by_pattern_and_by_depth():
    model = ResNet1d(24, 10, (8, 16))
    _, groups = groups_of(model, freeze=["stem", "blocks.0.*"])
    trained = set().union(*(names_in(model, g) for g in groups))
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen == {n for n, _ in model.named_parameters() if n.startswith(("stem.", "blocks.0."))}
    assert trained.isdisjoint(frozen) and trained | frozen == {n for n, _ in model.named_parameters()}

    deep = ResNet1d(24, 10, (8, 16))
    m, _ = groups_of(deep, freeze_depth=2)  # stem and blocks (drop holds no parameters); head trains
    assert {n for n, p in deep.named_parameters() if p.requires_grad} == {"head.weight", "head.bias"}
    assert m.summary()["trainable_tensors"] == 2


def test_lr_multipliers_make_groups_and_keep_weight_decay_off_norms():
    model = ResNet1d(24, 10, (8, 16))
    m, groups = groups_of(model, lr=1e-3, weight_decay=0.1, lr_multipliers={"head": 10, "blocks.*": 0.1})
    by = {(g["lr"], g["weight_decay"]): names_in(model, g) for g in groups}
    assert by[(1e-2, 0.1)] == {"head.weight"} and by[(1e-2, 0.0)] == {"head.bias"}
    assert all(n.startswith("blocks.") for n in by[(1e-4, 0.1)] | by[(1e-4, 0.0)])
    assert {n.split(".")[0] for n in by[(1e-3, 0.1)] | by[(1e-3, 0.0)]} == {"stem"}
    assert all(model.get_parameter(n).ndim >= 2 for k, ns in by.items() if k[1] > 0 for n in ns)
    assert m.summary()["lr_groups"]["head"] == {"lr_multiplier": 10, "lr": 1e-2, "tensors": 2}


def test_in_a_run_frozen_layers_stay_and_groups_get_their_lr(tiny_cfg, tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))
    start = {k: v.clone() for k, v in model.state_dict().items()}
    r = fit(tiny_cfg(**_ft(freeze=["0"], lr_multipliers={"2.bias": 0.5})), model=model, run_dir=tmp_path / "r")
    saved = load_file(tmp_path / "r" / "model.safetensors")
    assert torch.equal(saved["0.weight"], start["0.weight"]) and torch.equal(saved["0.bias"], start["0.bias"])
    assert not torch.equal(saved["2.weight"], start["2.weight"])
    assert sorted(g["lr"] for g in r.state.optimizer.param_groups) == [1.5e-3, 3e-3]  # optim.lr = 3e-3
    assert r.summary["methods"]["finetune"]["frozen_tensors"] == 2


@pytest.mark.parametrize("kw, words", [
    ({"freeze": ["encoder.*"]}, "freeze: 'encoder.*' matches no parameter; names look like stem.0.weight"),
    ({"lr_multipliers": {"decoder": 2}}, "lr_multipliers: 'decoder' matches no parameter"),
    ({"freeze": ["stem"], "lr_multipliers": {"stem.0": 2}}, "'stem.0' matches only frozen parameters"),
    ({"freeze_depth": 4}, "freeze_depth: 4 is more than the model's 3 top-level children"),
    ({"freeze": ["*"]}, "every parameter is frozen"),
])
def test_bad_patterns_are_config_errors(kw, words):
    with pytest.raises(ConfigError, match=words.replace("*", r"\*").replace(".", r"\.")):
        groups_of(ResNet1d(24, 10, (8, 16)), **kw)


def test_a_multiplier_must_be_positive(tiny_cfg):
    with pytest.raises(Exception, match="lr_multipliers"):
        tiny_cfg(**_ft(lr_multipliers={"0": 0}))


def test_resume_is_exact_with_finetune(tiny_cfg, tmp_path):
    def model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))

    cfg = tiny_cfg(**{"checkpoint.every_n_steps": 20, **_ft(freeze=["0.bias"], lr_multipliers={"2": 3})})
    fit(cfg, model=model(), run_dir=tmp_path / "full")
    cut = fit(cfg, model=model(), run_dir=tmp_path / "cut", callbacks=[SigtermAt(33)])
    fit(cfg, model=model(), run_dir=tmp_path / "cut", resume=cut.state.last_checkpoint)
    a, b = load_file(tmp_path / "full" / "model.safetensors"), load_file(tmp_path / "cut" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
