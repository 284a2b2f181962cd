"""methods/batchnorm.py's finalize under policy domain (running statistics are not recomputed; the
report names how they were made and every domain), a domain's carried statistics at the start, a
checkpoint of another policy, and a domain with no BN layers in the report."""

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from ecotrain.config import BatchNormConfig
from ecotrain.data import ArraySource
from ecotrain.methods.batchnorm import BatchNormPolicy, format_report

pytestmark = pytest.mark.unit


def policy(**kw) -> BatchNormPolicy:
    return BatchNormPolicy(BatchNormConfig(name="batchnorm", **kw))


def _model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3))
    with torch.no_grad():
        model[1].running_mean.fill_(0.5)
        model[1].running_var.fill_(2.0)
    return model


def _stats(mean, var):
    return {"1": {"mean": torch.full((3,), mean), "var": torch.full((3,), var)}}


def test_domain_running_statistics_are_kept_as_trained_not_recomputed():
    p = policy(policy="domain", domain="b")
    p.carried = {"a": _stats(1.0, 4.0)}
    model = p.transform(_model())
    with torch.no_grad():
        model[1].running_mean.fill_(0.75)  # what this run's batches moved them to
    train = ArraySource(torch.randn(8, 2) * 5, torch.zeros(8, dtype=torch.long))
    p.finalize(model, SimpleNamespace(train=train, val=None))
    assert torch.equal(model[1].running_mean, torch.full((3,), 0.75))
    assert "recomputed_on_samples" not in p.report
    assert (p.report["domain"], p.report["domain_stats"]) == ("b", "running")
    assert sorted(p.report["domains"]) == ["a", "b"]
    assert p.report["domains"]["a"]["1"]["var_ratio"] == pytest.approx(2.0, abs=1e-3)  # 4 against the start's 2

    r = policy(policy="domain", domain="b", domain_stats="recompute", recompute_batch_size=3)
    model = r.transform(_model())
    r.finalize(model, SimpleNamespace(train=train, val=None))
    assert r.report["recomputed_on_samples"] == 8 and r.report["domain_stats"] == "recompute"
    assert not torch.equal(model[1].running_mean, torch.full((3,), 0.5))


def test_a_domain_carried_over_starts_from_its_own_statistics():
    p = policy(policy="domain", domain="a")
    p.carried = {"a": _stats(1.0, 4.0), "z": _stats(9.0, 9.0)}
    model = p.transform(_model())
    assert torch.equal(model[1].running_mean, torch.full((3,), 1.0))
    assert torch.equal(model[1].running_var, torch.full((3,), 4.0))
    q = policy(policy="domain", domain="new")  # a domain not carried: the pre-trained statistics
    q.carried = {"a": _stats(1.0, 4.0)}
    model = q.transform(_model())
    assert torch.equal(model[1].running_mean, torch.full((3,), 0.5))


def test_another_policys_checkpoint_never_checks_or_takes_its_domains(ecotrain_log):
    d = policy(policy="domain", domain="a")
    d.transform(_model())
    d.carried = {"z": _stats(9.0, 9.0)}
    sd = d.state_dict()
    p = policy(policy="train")
    p.transform(_model())
    p.load_state_dict(sd)  # a domain run's state under policy train: a warning, no domain check
    assert p.carried == {} and "produced under policy domain" in ecotrain_log.text
    assert torch.equal(p.start["1"]["mean"], torch.full((3,), 0.5))


def test_a_domain_without_bn_layers_is_said_so_in_the_report():
    r = {"policy": "domain", "domain": "a", "domain_stats": "running", "layers": {},
         "domains": {"a": {}, "b": {"1": {"channels": 3, "mean_shift": 0.1, "max_mean_shift": 0.2, "var_ratio": 1.0}}}}
    lines = format_report(r).splitlines()
    at = lines.index("domain a (this run):")
    assert lines[at + 1] == "(no layers)"
    assert lines[lines.index("domain b (carried over):") + 1].startswith("layer")
