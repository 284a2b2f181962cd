"""methods/bn_domain.py and `batchnorm: {policy: domain}`: each domain's statistics are made only from
its own batches, an unknown domain gets the pre-trained ones, and the statistics survive the
checkpoint (exact resume), the export and a second run that carries them over."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from ecotrain import fit
from ecotrain.config import BatchNormConfig
from ecotrain.data import load_data
from ecotrain.base.errors import CheckpointError, ConfigError, DataError
from ecotrain.methods.batchnorm import BatchNormPolicy
from ecotrain.methods.bn_domain import (PRETRAINED, DomainStats, domain_column, from_tensors, read_stats, to_tensors,
                                        use_domain, write_stats)
from tests.unit.test_methods import SigtermAt


def bn_mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 10))


def pretrained_mlp():
    """A model whose running statistics are not BN's defaults (zeros and ones), as a pre-trained one's."""
    m = bn_mlp()
    with torch.no_grad():
        m[1].running_mean.copy_(torch.linspace(-1, 1, 16))
        m[1].running_var.copy_(torch.linspace(0.5, 2, 16))
    return m


def _dom(**kw):
    return {"methods": [{"name": "batchnorm", "policy": "domain", **kw}]}


def hidden(cfg, weights, x):
    """The BN layer's input for `x` under `weights` (what its statistics are of)."""
    return (x @ weights["0.weight"].T + weights["0.bias"]).double()


# -- the config -------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw, words", [({"policy": "domain"}, "needs the domain key"),
                                       ({"policy": "train", "domain": "a"}, "use policy: domain"),
                                       ({"policy": "recompute", "domain_stats": "recompute"}, "use policy: domain"),
                                       ({"policy": "domain", "domain": "a/b"}, "pattern")])
def test_options_must_fit_the_policy(kw, words):
    with pytest.raises(ValueError, match=words):
        BatchNormConfig(name="batchnorm", **kw)


# -- the statistics as tensors --------------------------------------------------------------------
def test_tensors_round_trip_and_use_domain_picks_the_fallback():
    model = pretrained_mlp()
    pre = read_stats(model)
    other = {k: {"mean": v["mean"] + 1, "var": v["var"] * 3} for k, v in pre.items()}
    back_pre, back = from_tensors(to_tensors(pre, {"b.x-1": other}), "t")
    assert set(back) == {"b.x-1"} and torch.equal(back["b.x-1"]["1"]["var"], other["1"]["var"])
    assert torch.equal(back_pre["1"]["mean"], pre["1"]["mean"])
    stats = DomainStats(back_pre, back)
    assert use_domain(model, stats, "b.x-1") == "b.x-1" and torch.equal(model[1].running_mean, other["1"]["mean"])
    assert use_domain(model, stats, "never-seen") == PRETRAINED and torch.equal(model[1].running_var, pre["1"]["var"])
    with pytest.raises(CheckpointError, match="no per-domain BatchNorm statistics"):
        from_tensors({"x": torch.zeros(1)}, "f")
    with pytest.raises(CheckpointError, match="of another model"):
        write_stats(model, {"1": {"mean": torch.zeros(3), "var": torch.ones(3)}})


def test_domain_column_reads_ints_and_strings_and_refuses_bad_shapes(tmp_path):
    np.savez(tmp_path / "a.npz", x=np.zeros((3, 2)), domain=np.array(["a", "b", "a"]), domain_test=np.array([1, 2]))
    assert domain_column(tmp_path / "a.npz", "all", 3).tolist() == ["a", "b", "a"]
    assert domain_column(tmp_path / "a.npz", "test", 2).tolist() == ["1", "2"]
    with pytest.raises(DataError, match="one integer or string domain key per row"):
        domain_column(tmp_path / "a.npz", "all", 4)
    np.savez(tmp_path / "b.npz", x=np.zeros((3, 2)))
    assert domain_column(tmp_path / "b.npz", "all", 3) is None


# -- in a run ---------------------------------------------------------------------------------------
def test_only_the_runs_domain_moves_and_the_pretrained_stay_the_fallback(tiny_cfg, tmp_path):
    cfg = tiny_cfg(**_dom(domain="clinic_b"))
    model = pretrained_mlp()
    pre = read_stats(model)
    r = fit(cfg, model=model, run_dir=tmp_path / "r")
    saved = load_file(tmp_path / "r" / "model.safetensors")
    exported = load_file(tmp_path / "r" / "export.safetensors")
    e_pre, e_dom = from_tensors({k.removeprefix("batchnorm/"): v for k, v in exported.items()}, "export")
    assert set(e_dom) == {"clinic_b"}
    assert torch.equal(e_pre["1"]["mean"], pre["1"]["mean"]) and torch.equal(e_pre["1"]["var"], pre["1"]["var"])
    # the saved model holds the run's domain's statistics, which moved from the pre-trained ones
    assert torch.equal(saved["1.running_mean"], e_dom["clinic_b"]["1"]["mean"])
    assert not torch.allclose(saved["1.running_mean"], pre["1"]["mean"])
    rep = r.summary["methods"]["batchnorm"]
    assert rep["domain"] == "clinic_b" and rep["domains"]["clinic_b"]["1"]["mean_shift"] > 0


def test_recompute_per_domain_gives_the_domains_exact_statistics(tiny_cfg, tmp_path):
    cfg = tiny_cfg(**_dom(domain="d", domain_stats="recompute"))
    r = fit(cfg, model=pretrained_mlp(), run_dir=tmp_path / "r")
    saved = load_file(tmp_path / "r" / "model.safetensors")
    h = hidden(cfg, saved, load_data(cfg).train.x)
    exported = load_file(tmp_path / "r" / "export.safetensors")
    assert torch.allclose(exported["batchnorm/domain/d/1/mean"].double(), h.mean(0), atol=1e-5)
    assert torch.allclose(exported["batchnorm/domain/d/1/var"].double(), h.var(0), rtol=1e-5)
    assert r.summary["methods"]["batchnorm"]["recomputed_on_samples"] == len(h)


def test_a_second_domain_carries_the_first_and_leaves_it_untouched(tiny_cfg, tmp_path):
    fit(tiny_cfg(**_dom(domain="a")), model=pretrained_mlp(), run_dir=tmp_path / "a")
    first = load_file(tmp_path / "a" / "export.safetensors")
    cfg = tiny_cfg(**{**_dom(domain="b", domains_from=str(tmp_path / "a")), "seed": 1})
    r = fit(cfg, model=bn_mlp(5), run_dir=tmp_path / "b", init_from=tmp_path / "a" / "model.safetensors")
    second = load_file(tmp_path / "b" / "export.safetensors")
    for k in ("batchnorm/domain/a/1/mean", "batchnorm/domain/a/1/var", "batchnorm/pretrained/1/mean",
              "batchnorm/pretrained/1/var"):
        assert torch.equal(first[k], second[k]), k  # b's batches never touched a's nor the pre-trained statistics
    assert not torch.equal(second["batchnorm/domain/b/1/mean"], second["batchnorm/domain/a/1/mean"])
    assert set(r.summary["methods"]["batchnorm"]["domains"]) == {"a", "b"}
    fit(tiny_cfg(), run_dir=tmp_path / "plain")
    with pytest.raises(ConfigError, match="without export.safetensors"):  # a run trained without domains has none
        BatchNormPolicy(BatchNormConfig(name="batchnorm", policy="domain", domain="c",
                                        domains_from=str(tmp_path / "plain")))


def test_resume_is_exact_and_the_checkpoint_holds_the_domains(tiny_cfg, tmp_path):
    fit(tiny_cfg(**_dom(domain="a")), model=pretrained_mlp(), run_dir=tmp_path / "a")
    cfg = tiny_cfg(**{"checkpoint.every_n_steps": 20, **_dom(domain="b", domains_from=str(tmp_path / "a"))})
    init = tmp_path / "a" / "model.safetensors"
    full = fit(cfg, model=bn_mlp(), run_dir=tmp_path / "full", init_from=init)
    cut = fit(cfg, model=bn_mlp(), run_dir=tmp_path / "cut", callbacks=[SigtermAt(33)], init_from=init)
    assert cut.summary["stopped_because"] == "preempted"
    meta = json.loads((tmp_path / "cut" / "checkpoints" / "step-00000034" / "meta.json").read_text())
    state = meta["methods"]["batchnorm"]
    assert state["domain"] == "b" and "a" in json.dumps(state["carried"])
    other = tiny_cfg(**{"checkpoint.every_n_steps": 20, **_dom(domain="z", domains_from=str(tmp_path / "a"))})
    with pytest.raises(ConfigError, match="trained domain 'b'"):
        fit(other, model=bn_mlp(1), run_dir=tmp_path / "cut", resume=cut.state.last_checkpoint,
            allow_config_change=True)
    resumed = fit(cfg, model=bn_mlp(1), run_dir=tmp_path / "cut", resume=cut.state.last_checkpoint)
    for name in ("model.safetensors", "export.safetensors"):
        a, b = load_file(tmp_path / "full" / name), load_file(tmp_path / "cut" / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    assert resumed.summary["methods"]["batchnorm"] == full.summary["methods"]["batchnorm"]
