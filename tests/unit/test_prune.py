"""Pruning: the gradual schedule, magnitude masks at the asked sparsity, structured pruning that shrinks
the layers to exactly the masked model, state dicts a fresh model loads, and exact resume."""

import copy
import json

import pytest
import torch
from safetensors.torch import load_file

from ecotrain import fit
from ecotrain.base.errors import ConfigError
from ecotrain.methods.prune import Prune, forward_flops, is_stage, target_sparsity
from ecotrain.models import MLP, ConvBase, ResNet1d
from tests.unit.test_methods import SigtermAt


def _prune(tiny_cfg, **kw):
    cfg = tiny_cfg(methods=[{"name": "prune", **kw}])
    return Prune(cfg.methods[0], cfg)


def test_schedule_is_gradual_and_ends_at_the_amount():
    cubic = [target_sparsity(t, 10, 50, 0.8) for t in range(0, 61, 10)]
    assert cubic[:2] == [0.0, 0.0] and cubic[-2:] == [0.8, 0.8]
    assert all(a < b for a, b in zip(cubic[1:-1], cubic[2:-1]))
    assert cubic[2] == pytest.approx(0.8 * (1 - 0.75 ** 3))  # cubic: most of the pruning early
    assert target_sparsity(30, 10, 50, 0.8, "linear") == pytest.approx(0.4)
    assert [t for t in range(0, 60) if is_stage(t, 10, 45, 10)] == [20, 30, 40, 45]


def test_unstructured_masks_hit_the_sparsity_and_keep_the_largest(tiny_cfg):
    torch.manual_seed(0)
    model = MLP(64, 10, hidden=(32,))
    p = _prune(tiny_cfg, amount=0.6, scope="global")
    p.transform(model)
    before = {n: m.weight.detach().clone() for n, m in p.layers.items()}
    p._stage(0.6, None)
    w = torch.cat([m.weight.flatten() for m in p.layers.values()])
    assert (w == 0).float().mean().item() == pytest.approx(0.6, abs=1e-3)
    kept = torch.cat([before[n].abs().flatten()[m.weight.flatten() != 0] for n, m in p.layers.items()])
    gone = torch.cat([before[n].abs().flatten()[m.weight.flatten() == 0] for n, m in p.layers.items()])
    assert kept.min() >= gone.max()
    layer = _prune(tiny_cfg, amount=0.5, scope="layer")
    layer.transform(MLP(64, 10, hidden=(32,)))
    layer._stage(0.5, None)
    assert all((m.weight == 0).float().mean().item() == pytest.approx(0.5, abs=0.01) for m in layer.layers.values())


@pytest.mark.parametrize("make", [lambda: ConvBase(40, 10, channels=8), lambda: MLP(40, 10, hidden=(16, 12))])
def test_structured_shrinks_to_exactly_the_masked_model(tiny_cfg, make):
    torch.manual_seed(1)
    model = make()
    dense = copy.deepcopy(model)
    p = _prune(tiny_cfg, kind="structured", amount=0.5, norm=2)
    p.transform(model)
    x = torch.randn(5, 40)
    flops_before = forward_flops(model, x[:1])
    p._stage(0.5, None)
    for _, prod, cons, _ in p.pairs:  # half the channels are gone, and the next layer's inputs with them
        assert prod.weight.shape[0] == prod.prune_out.numel() // 2 == int(prod.prune_out.sum())
        assert cons.weight.shape[1] == int(cons.prune_in.sum())
    masked = dict(dense.named_modules())
    with torch.no_grad():
        for name, prod, _, _ in p.pairs:  # the masked model: pruned channels' weights and biases zero
            masked[name].weight[~prod.prune_out] = 0
            masked[name].bias[~prod.prune_out] = 0
    assert torch.allclose(model(x), dense(x), atol=1e-6)
    assert forward_flops(model, x[:1]) < flops_before  # real work removed, as measured
    # its state_dict keeps the original shapes, and loading it shrinks a fresh model to the masks
    sd = model.state_dict()
    assert all(sd[k].shape == v.shape for k, v in make().state_dict().items())
    fresh = make()
    _prune(tiny_cfg, kind="structured", amount=0.5).transform(fresh)
    fresh.load_state_dict(sd)
    assert torch.equal(fresh(x), model(x))
    assert [t.shape for t in fresh.parameters()] == [t.shape for t in model.parameters()]


def test_refusals(tiny_cfg):
    with pytest.raises(ConfigError, match="mlp and cnn"):
        _prune(tiny_cfg, kind="structured").transform(ResNet1d(40, 10))
    with pytest.raises(ConfigError, match="match no prunable layer"):
        _prune(tiny_cfg, modules=["nothing.*"]).transform(MLP(40, 10))
    cfg = tiny_cfg(methods=[{"name": "ema"}, {"name": "prune"}])
    with pytest.raises(ConfigError, match="ema"):
        Prune(cfg.methods[1], cfg)


def test_structured_run_shrinks_recounts_and_resumes_exactly(tiny_cfg, tmp_path):
    prune = {"name": "prune", "kind": "structured", "amount": 0.5, "start_step": 5, "end_step": 25, "every": 10}
    cfg = tiny_cfg(**{"checkpoint.every_n_steps": 10, "loop.max_steps": 40, "ledger.energy": "off",
                      "model.kwargs": {"hidden": [32, 32]}}, methods=[prune])
    full = fit(cfg, run_dir=tmp_path / "full")
    opt_params = {id(p) for g in full.state.optimizer.param_groups for p in g["params"]}
    assert opt_params == {id(p) for p in full.state.model.parameters()}  # the optimizer follows the new layers
    cut = fit(cfg, run_dir=tmp_path / "cut", callbacks=[SigtermAt(22)])  # between the two shrinking stages
    fit(cfg, run_dir=tmp_path / "cut", resume=cut.state.last_checkpoint)
    a, b = load_file(tmp_path / "full" / "model.safetensors"), load_file(tmp_path / "cut" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    s = json.loads((tmp_path / "full" / "summary.json").read_text())["methods"]["prune"]
    ledger = json.loads((tmp_path / "full" / "ledger.json").read_text())["flops"]
    assert s["sparsity"] == 0.5 and s["parameters_after"] < s["parameters_before"]
    assert s["forward_flops_per_sample_after"] < s["forward_flops_per_sample_before"]
    assert ledger["remeasured"] >= 2 and ledger["forward_per_sample"] == s["forward_flops_per_sample_after"]
    small = load_file(tmp_path / "full" / "export.safetensors")
    assert small["prune/net.0.weight"].shape == (16, 64)


def test_unstructured_run_claims_no_dense_flop_cut_and_resumes_exactly(tiny_cfg, tmp_path):
    prune = {"name": "prune", "amount": 0.7, "end_step": 20, "every": 5}
    cfg = tiny_cfg(**{"checkpoint.every_n_steps": 10, "loop.max_steps": 30, "ledger.energy": "off"}, methods=[prune])
    fit(cfg, run_dir=tmp_path / "full")
    cut = fit(cfg, run_dir=tmp_path / "cut", callbacks=[SigtermAt(13)])
    fit(cfg, run_dir=tmp_path / "cut", resume=cut.state.last_checkpoint)
    a, b = load_file(tmp_path / "full" / "model.safetensors"), load_file(tmp_path / "cut" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    s = json.loads((tmp_path / "full" / "summary.json").read_text())["methods"]["prune"]
    assert s["sparsity"] == pytest.approx(0.7, abs=1e-3) and s["dense_flops_cut"] is False
    assert s["forward_flops_per_sample_after"] == s["forward_flops_per_sample_before"]
    assert sum(int((v == 0).sum()) for k, v in a.items() if k.endswith("weight")) >= 0.69 * sum(
        v.numel() for k, v in a.items() if k.endswith("weight"))
