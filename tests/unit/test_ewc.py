"""EWC: the diagonal Fisher (positive, exported, loaded, accumulated online) and the penalty."""

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from ecotrain import fit
from ecotrain.errors import CheckpointError
from ecotrain.methods.ewc import diagonal_fisher, load_anchor, penalty


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 3))


def test_fisher_is_positive_matches_a_loop_and_leaves_the_mode():
    model, x, y = _model(), torch.randn(20, 8), torch.randint(0, 3, (20,))
    model.train()
    f = diagonal_fisher(model, x, y)
    assert model.training  # restored
    assert all((v >= 0).all() for v in f.values()) and sum(float(v.sum()) for v in f.values()) > 0
    model.eval()
    ref = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    for i in range(20):  # one example at a time: the definition
        model.zero_grad()
        nn.functional.cross_entropy(model(x[i:i + 1]), y[i:i + 1]).backward()
        for n, p in model.named_parameters():
            ref[n] += p.grad.square() / 20
    for n in ref:
        torch.testing.assert_close(f[n], ref[n], rtol=1e-4, atol=1e-7)
    expected = diagonal_fisher(model, x, y, "expected")
    assert all((v >= 0).all() for v in expected.values()) and not torch.equal(expected["3.weight"], f["3.weight"])


def test_penalty_is_zero_at_theta_old_and_grows_quadratically():
    model = _model()
    theta = {n: p.detach().clone() for n, p in model.named_parameters()}
    fisher = {n: torch.rand_like(p) + 0.1 for n, p in model.named_parameters()}
    assert float(penalty(model, fisher, theta).detach()) == 0.0
    with torch.no_grad():
        model[0].weight += 0.1
    p1 = float(penalty(model, fisher, theta).detach())
    with torch.no_grad():
        model[0].weight += 0.1
    assert p1 > 0 and float(penalty(model, fisher, theta).detach()) == pytest.approx(4 * p1, rel=1e-4)


def test_fisher_exported_loaded_and_accumulated_online(tiny_cfg, tmp_path):
    def cfg(**m):
        return tiny_cfg(**{"methods": [{"name": "ewc", "beta": 50.0, "samples": 64, **m}], "loop.max_steps": 8, "loop.log_every": 2,
                           "loop.eval_every": 8, "ledger.enabled": False})

    fit(cfg(), run_dir=tmp_path / "v0", quiet=True)
    fisher0, theta0 = load_anchor(tmp_path / "v0")
    exported = load_file(tmp_path / "v0" / "model.safetensors")
    assert set(fisher0) == {k for k in exported}  # every trainable parameter of the MLP
    assert all(torch.equal(theta0[k], exported[k]) for k in theta0)
    r1 = fit(cfg(**{"from": str(tmp_path / "v0"), "gamma": 0.5}), run_dir=tmp_path / "v1", quiet=True,
             init_from=tmp_path / "v0")
    import json
    logs = [json.loads(x) for x in (tmp_path / "v1" / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
    assert logs and all(x["loss_ewc"] > 0 for x in logs)  # moved away from theta_old: a penalty
    fisher1, theta1 = load_anchor(tmp_path / "v1")
    # online: at least gamma * the previous Fisher everywhere
    assert all((fisher1[n] >= 0.5 * fisher0[n] - 1e-7).all() for n in fisher0)
    assert r1.summary["methods"]["ewc"]["anchored"] is True


def test_a_different_model_is_one_line(tiny_cfg, tmp_path):
    def cfg(hidden, **m):
        return tiny_cfg(**{"methods": [{"name": "ewc", "samples": 16, **m}], "model.kwargs": {"hidden": hidden},
                           "loop.max_steps": 2, "loop.eval_every": 2, "ledger.enabled": False})
    fit(cfg([32]), run_dir=tmp_path / "v0", quiet=True)
    with pytest.raises(CheckpointError, match=r"parameter 'net.0.(weight|bias)' .* same model"):
        fit(cfg([16], **{"from": str(tmp_path / "v0")}), run_dir=tmp_path / "v1", quiet=True)
