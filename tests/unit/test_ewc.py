"""EWC: the diagonal Fisher (positive, exported, loaded, accumulated online) and the penalty."""

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from ecotrain import fit
from ecotrain.base.errors import CheckpointError
from ecotrain.methods.ewc import EWC, diagonal_fisher, load_anchor, penalty


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


@pytest.mark.parametrize("accumulate", [1, 3])
def test_penalty_trains_the_model_not_only_the_log(tiny_cfg, accumulate):
    """The step's gradient is CE's plus d/dtheta beta * sum F (theta - theta_old)^2 = 2 beta F (theta - theta_old),
    once per step however it is accumulated: a penalty detached from the graph (logged, not trained) fails here."""
    from types import SimpleNamespace

    from ecotrain.core.distributed import Dist
    from ecotrain.core.loop import backward_micro_batches
    from ecotrain.methods import Methods
    from ecotrain.core.objective import Objective
    from ecotrain.core.precision import Precision
    from ecotrain.core.task import ClassificationTask

    cfg = tiny_cfg(**{"methods": [{"name": "ewc", "beta": 3.0}]})
    m = EWC(cfg.methods[0], cfg)
    model = _model().double()
    theta = {n: (p.detach() + 0.1 * torch.randn_like(p)) for n, p in model.named_parameters()}
    m.fisher = {n: torch.rand_like(p) + 0.5 for n, p in model.named_parameters()}
    m.theta = theta
    m.transform(model)
    model.eval()  # no dropout: the task gradient below is the same function
    x, y = torch.randn(9, 8, dtype=torch.double), torch.randint(0, 3, (9,))
    st = SimpleNamespace(model=model, precision=Precision("fp32", torch.device("cpu")), dist=Dist(),
                         objective=Objective(ClassificationTask(), Methods([m])), task=ClassificationTask())
    backward_micro_batches(st, (x, y), accumulate)
    got = {n: p.grad.clone() for n, p in model.named_parameters()}

    task = dict(zip(got, torch.autograd.grad(nn.functional.cross_entropy(model(x), y), list(model.parameters()))))
    for n, p in model.named_parameters():
        pull = 2 * 3.0 * m.fisher[n] * (p.detach() - theta[n])
        assert pull.abs().max() > 1e-3  # the penalty does pull every parameter towards theta_old
        torch.testing.assert_close(got[n], task[n] + pull, rtol=1e-6, atol=1e-9)
    want = 3.0 * penalty(model, m.fisher, theta).item()
    assert st.loss_parts["ewc"].item() == pytest.approx(want, rel=1e-6)  # and what is logged is what trained


# ---- what the mutation run (tests/mutants.py) found untested ---------------------------------
@pytest.mark.parametrize("n", [1, 70])  # one example; more than one vmap chunk (64)
def test_both_fishers_match_their_definition(n):
    """empirical: mean of grad log p(y|x)^2; expected: mean over x of sum_c p(c|x) grad log p(c|x)^2."""
    model, x, y = _model().eval(), torch.randn(n, 8), torch.randint(0, 3, (n,))
    emp = {n_: torch.zeros_like(p) for n_, p in model.named_parameters()}
    exp = {n_: torch.zeros_like(p) for n_, p in model.named_parameters()}
    for i in range(n):
        probs = model(x[i:i + 1]).softmax(-1)[0].detach()
        for c in range(3):
            model.zero_grad()
            nn.functional.cross_entropy(model(x[i:i + 1]), torch.tensor([c])).backward()
            for n_, p in model.named_parameters():
                exp[n_] += probs[c] * p.grad.square() / n
                if c == y[i]:
                    emp[n_] += p.grad.square() / n
    got_emp, got_exp = diagonal_fisher(model, x, y), diagonal_fisher(model, x, y, "expected")
    for n_ in emp:
        torch.testing.assert_close(got_emp[n_], emp[n_], rtol=1e-4, atol=1e-7)
        torch.testing.assert_close(got_exp[n_], exp[n_], rtol=1e-4, atol=1e-7)


def _anchor_file(path, **tensors):
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    return path


def test_a_damaged_anchor_and_fsdp_are_one_line(tiny_cfg, tmp_path):
    from ecotrain.base.errors import ConfigError

    f = _anchor_file(tmp_path / "a.safetensors", **{"ewc/fisher/w": torch.ones(2), "ewc/theta/v": torch.ones(2)})
    with pytest.raises(CheckpointError, match=r"^methods.ewc.from: .*a.safetensors: the Fisher and theta tensors do not "
                                              "name the same parameters; the file is damaged"):
        load_anchor(f)
    with pytest.raises(CheckpointError, match=r"^methods.ewc.from: .*r.safetensors holds nothing under 'ewc/'"):
        load_anchor(_anchor_file(tmp_path / "r.safetensors", **{"replay/x": torch.ones(2)}))
    with pytest.raises(ConfigError, match=r"^methods.ewc.from: .*nope not found; give the previous run folder"):
        EWC(tiny_cfg(**{"methods": [{"name": "ewc", "from": str(tmp_path / "nope")}]}).methods[0], tiny_cfg())
    with pytest.raises(ConfigError, match=r"^methods.ewc: not supported with distributed.strategy=fsdp \(sharded parameters\); use ddp or one process$"):
        EWC(tiny_cfg(**{"methods": [{"name": "ewc"}]}).methods[0], tiny_cfg(**{"distributed.strategy": "fsdp"}))


def test_anchor_of_another_model_names_the_parameter(tiny_cfg, tmp_path):

    def ewc_from(**tensors):
        f = _anchor_file(tmp_path / "a.safetensors", **tensors)
        cfg = tiny_cfg(**{"methods": [{"name": "ewc", "from": str(f)}]})
        return EWC(cfg.methods[0], cfg)

    m = ewc_from(**{"ewc/fisher/nope": torch.ones(2), "ewc/theta/nope": torch.ones(2)})
    with pytest.raises(CheckpointError, match=r"parameter 'nope' of shape \(2,\) \(no such parameter\); the previous "
                                              "version must be the same model"):
        m.transform(_model())
    m = ewc_from(**{"ewc/fisher/0.bias": torch.ones(2), "ewc/theta/0.bias": torch.ones(2)})
    with pytest.raises(CheckpointError, match=r"parameter '0.bias' of shape \(2,\) \(shape \(16,\) here\)"):
        m.transform(_model())


def test_finalize_is_seeded_exact_and_online(tiny_cfg):
    from types import SimpleNamespace

    from ecotrain.data import ArraySource

    model = _model()
    torch.manual_seed(1)
    x, y = torch.randn(30, 8), torch.randint(0, 3, (30,))
    data = SimpleNamespace(train=ArraySource(x, y))

    def finalize(anchor=None, **kw):
        cfg = tiny_cfg(**{"methods": [{"name": "ewc", **kw}]})
        m = EWC(cfg.methods[0], cfg)
        assert m.export(model) is None and m.summary() == {}  # nothing before finalize
        if anchor:
            m.fisher, m.theta = anchor, {n: p.detach() for n, p in model.named_parameters()}
        m.finalize(model, data)
        return m

    for kind in ("empirical", "expected"):  # samples >= rows: every row, in order
        m = finalize(samples=100, fisher=kind)
        want = diagonal_fisher(model, x, y, kind)
        assert all(torch.equal(m.new_fisher[n], want[n]) for n in want), kind
        assert m.summary() == {"fisher_samples": 30, "fisher_sum": pytest.approx(sum(float(v.sum()) for v in want.values())),
                               "anchored": False}
    a, b = finalize(samples=10), finalize(samples=10)  # a seeded subset: the same one each time
    assert all(torch.equal(a.new_fisher[n], b.new_fisher[n]) for n in a.new_fisher)
    old = {n: torch.full_like(f, 2.0) for n, f in a.new_fisher.items()}
    online = finalize(old, samples=10, gamma=0.25)
    for n, f in a.new_fisher.items():
        torch.testing.assert_close(online.new_fisher[n], f + 0.25 * 2.0)  # F = F_this + gamma * F_previous
    assert online.summary()["anchored"] is True
    exported = online.export(model)
    assert set(exported) == {f"{k}/{n}" for k in ("fisher", "theta") for n in old}


def test_resume_refuses_an_anchor_that_changed(tiny_cfg, tmp_path):
    from ecotrain.methods.replay import file_digest

    f = _anchor_file(tmp_path / "a.safetensors", **{"ewc/fisher/w": torch.ones(2), "ewc/theta/w": torch.ones(2)})
    cfg = tiny_cfg(**{"methods": [{"name": "ewc", "from": str(f)}]})
    sd = EWC(cfg.methods[0], cfg).state_dict()
    assert sd == {"from_digest": file_digest(f)}
    EWC(cfg.methods[0], cfg).load_state_dict(sd)
    _anchor_file(f, **{"ewc/fisher/w": torch.ones(2), "ewc/theta/w": torch.zeros(2)})
    with pytest.raises(CheckpointError, match=r"^methods.ewc.from: .*a.safetensors changed since the run started; "
                                              "resume with the Fisher it started from"):
        EWC(cfg.methods[0], cfg).load_state_dict(sd)
