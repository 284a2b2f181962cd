"""methods/batchnorm.py: each policy's mechanics (freeze, exact recompute, GroupNorm swap, momentum),
exact resume with each policy on, the bn report and where the policy is recorded."""

import json

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from ecotrain import Callback, fit
from ecotrain.config import BatchNormConfig
from ecotrain.data import ArraySource, load_data
from ecotrain.base.errors import ConfigError
from ecotrain.methods.batchnorm import BatchNormPolicy, bn_layers, format_report, read_report, recompute_stats
from ecotrain.models import ResNet1d
from tests.unit.test_methods import SigtermAt

POLICIES = [{"policy": "train"}, {"policy": "freeze_stats"}, {"policy": "recompute"},
            {"policy": "groupnorm", "groups": 4}, {"policy": "momentum", "momentum": 0.01}]


def _bn(**kw):
    return {"methods": [{"name": "batchnorm", **kw}]}


def bn_mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 10))


def policy(**kw) -> BatchNormPolicy:
    return BatchNormPolicy(BatchNormConfig(name="batchnorm", **kw))


# -- freeze_stats ---------------------------------------------------------------------------------
def test_freeze_stats_survives_the_loops_train_calls(tiny_cfg, tmp_path):
    class Watch(Callback):
        modes = []

        def on_step_end(self, state):
            self.modes.append(state.model[1].training)

    model = bn_mlp()
    stats = (model[1].running_mean.clone(), model[1].running_var.clone())
    gamma = model[1].weight.detach().clone()
    r = fit(tiny_cfg(**_bn(policy="freeze_stats")), model=model, callbacks=[Watch()], run_dir=tmp_path / "r")
    assert len(Watch.modes) == 60 and not any(Watch.modes)  # eval mode at every step, after every model.train()
    assert model[0].training  # the rest of the model did train in train mode
    assert torch.equal(model[1].running_mean, stats[0]) and torch.equal(model[1].running_var, stats[1])
    assert not torch.equal(model[1].weight, gamma)  # gamma and beta still train
    report = r.summary["methods"]["batchnorm"]
    assert report["policy"] == "freeze_stats" and report["layers"]["1"]["mean_shift"] == 0.0
    assert report["layers"]["1"]["var_ratio"] == 1.0 and report["mode_gap"] == 0.0  # training ran as eval runs


def test_freeze_stats_train_mode_hook():
    model, m = bn_mlp(), policy(policy="freeze_stats")
    model = m.transform(model)
    model.train()
    m.train_mode(model)
    assert not model[1].training and model[0].training


# -- recompute ------------------------------------------------------------------------------------
def test_recompute_equals_the_exact_dataset_statistics():
    torch.manual_seed(0)
    x = torch.randn(103, 64) * 3 + 1  # 103 samples in batches of 16: a short last batch
    src = ArraySource(x, torch.zeros(103, dtype=torch.long))
    model = bn_mlp()
    model[1].momentum = 0.3
    recompute_stats(model, src, 16, torch.device("cpu"))
    h = model[0](x).detach().double()
    assert torch.allclose(model[1].running_mean.double(), h.mean(0), atol=1e-5)
    assert torch.allclose(model[1].running_var.double(), h.var(0, unbiased=True), rtol=1e-5)
    assert model[1].momentum == 0.3 and model.training and model[1].training  # modes and momentum put back
    assert int(model[1].num_batches_tracked) == 0  # the pass is not training


def test_recompute_of_a_conv_net_matches_update_bn_in_one_batch():
    """Every layer of a (dropout-free) ResNet: what swa_utils.update_bn gives with the data in one batch,
    whatever batch size the pass uses for the first layer, whose input no other BN changes."""
    from torch.optim.swa_utils import update_bn

    torch.manual_seed(0)
    x = torch.randn(40, 24) * 2 - 0.5
    ours, ref = ResNet1d(24, 10, (8, 16)), ResNet1d(24, 10, (8, 16))
    ref.load_state_dict(ours.state_dict())
    recompute_stats(ours, ArraySource(x, torch.zeros(40, dtype=torch.long)), 40, torch.device("cpu"))
    update_bn([x], ref)
    for (name, a), b in zip(bn_layers(ours).items(), bn_layers(ref).values()):
        assert torch.allclose(a.running_mean, b.running_mean, atol=1e-5), name
        assert torch.allclose(a.running_var, b.running_var, rtol=1e-4, atol=1e-6), name
    small = ResNet1d(24, 10, (8, 16))
    small.load_state_dict(ours.state_dict())
    recompute_stats(small, ArraySource(x, torch.zeros(40, dtype=torch.long)), 7, torch.device("cpu"))
    assert torch.allclose(small.stem[1].running_mean, ours.stem[1].running_mean, atol=1e-5)
    assert torch.allclose(small.stem[1].running_var, ours.stem[1].running_var, rtol=1e-5)


def test_recompute_in_a_run_sets_the_train_datas_statistics(tiny_cfg, tmp_path):
    cfg = tiny_cfg(**_bn(policy="recompute"))
    r = fit(cfg, model=bn_mlp(), run_dir=tmp_path / "r")
    saved = load_file(tmp_path / "r" / "model.safetensors")
    train_x = load_data(cfg).train.x
    h = (train_x @ saved["0.weight"].T + saved["0.bias"]).double()
    assert torch.allclose(saved["1.running_mean"].double(), h.mean(0), atol=1e-5)
    assert torch.allclose(saved["1.running_var"].double(), h.var(0), rtol=1e-5)
    assert r.summary["methods"]["batchnorm"]["recomputed_on_samples"] == len(train_x)


# -- groupnorm ------------------------------------------------------------------------------------
def test_groupnorm_swap_keeps_the_parameter_count_and_the_affine_values():
    torch.manual_seed(0)
    model = ResNet1d(24, 10, (8, 16))
    for m in bn_layers(model).values():
        nn.init.normal_(m.weight)
        nn.init.normal_(m.bias)
    before = {n: (m.weight.detach().clone(), m.bias.detach().clone(), m.eps) for n, m in bn_layers(model).items()}
    count = sum(p.numel() for p in model.parameters())
    model = policy(policy="groupnorm", groups=4).transform(model)
    assert not bn_layers(model) and sum(p.numel() for p in model.parameters()) == count
    for name, (w, b, eps) in before.items():
        gn = model.get_submodule(name)
        assert isinstance(gn, nn.GroupNorm) and gn.num_groups == 4 and gn.eps == eps, name
        assert torch.equal(gn.weight, w) and torch.equal(gn.bias, b), name
    assert model(torch.randn(3, 24)).shape == (3, 10)


def test_groupnorm_that_does_not_divide_a_layer_names_it():
    with pytest.raises(ConfigError, match=r"groups=3 does not divide the 8 channels of BatchNorm layer 'stem.1'.*"
                                          r"largest here: 2"):
        policy(policy="groupnorm", groups=3).transform(ResNet1d(24, 10, (8, 12)))


# -- momentum -------------------------------------------------------------------------------------
def test_momentum_override_is_applied():
    model = policy(policy="momentum", momentum=0.01).transform(ResNet1d(24, 10, (8, 16)))
    assert {m.momentum for m in bn_layers(model).values()} == {0.01}
    x = torch.randn(5, 24)
    stem_in = model.stem[0](x.view(5, 1, -1)).detach()
    model.train()
    model(x)
    assert torch.allclose(model.stem[1].running_mean, 0.01 * stem_in.mean((0, 2)), atol=1e-6)


# -- the config -----------------------------------------------------------------------------------
@pytest.mark.parametrize("kw, words", [({"policy": "momentum"}, "needs a value"),
                                       ({"policy": "train", "momentum": 0.1}, "use policy: momentum"),
                                       ({"policy": "recompute", "groups": 8}, "use policy: groupnorm"),
                                       ({"policy": "nope"}, "policy")])
def test_options_must_fit_the_policy(tiny_cfg, kw, words):
    with pytest.raises(Exception, match=words):
        tiny_cfg(**_bn(**kw))


def test_a_model_without_batchnorm_is_refused(tiny_cfg, tmp_path):
    with pytest.raises(ConfigError, match="no BatchNorm layers"):
        fit(tiny_cfg(**_bn(policy="recompute")), run_dir=tmp_path / "r")
    assert not (tmp_path / "r").exists()


# -- exact resume, and the policy in checkpoints and summary.json ----------------------------------
@pytest.mark.parametrize("kw", POLICIES, ids=[p["policy"] for p in POLICIES])
def test_resume_is_exact_with_each_policy(tiny_cfg, tmp_path, kw):
    cfg = tiny_cfg(**{"checkpoint.every_n_steps": 20, **_bn(**kw)})
    full = fit(cfg, model=bn_mlp(), run_dir=tmp_path / "full")
    cut = fit(cfg, model=bn_mlp(), run_dir=tmp_path / "cut", callbacks=[SigtermAt(33)])
    assert cut.summary["stopped_because"] == "preempted"
    meta = json.loads((tmp_path / "cut" / "checkpoints" / "step-00000034" / "meta.json").read_text())
    assert meta["methods"]["batchnorm"]["policy"] == kw["policy"]  # checkpoints record the policy
    resumed = fit(cfg, model=bn_mlp(1), run_dir=tmp_path / "cut", resume=cut.state.last_checkpoint)
    a, b = load_file(tmp_path / "full" / "model.safetensors"), load_file(tmp_path / "cut" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert resumed.summary["methods"]["batchnorm"] == full.summary["methods"]["batchnorm"]  # same start, same report
    summary = json.loads((tmp_path / "cut" / "summary.json").read_text())
    assert summary["methods"]["batchnorm"]["policy"] == kw["policy"]  # so does the run folder


def test_the_report_measures_from_the_init_from_weights(tiny_cfg, tmp_path, ecotrain_log):
    first = fit(tiny_cfg(**_bn(policy="train")), model=bn_mlp(), run_dir=tmp_path / "a")
    assert first.summary["methods"]["batchnorm"]["layers"]["1"]["mean_shift"] > 0  # moved from the init
    r = fit(tiny_cfg(**{**_bn(policy="freeze_stats", warn_gap=0.0)}), model=bn_mlp(), run_dir=tmp_path / "b",
            init_from=tmp_path / "a" / "model.safetensors")
    layer = r.summary["methods"]["batchnorm"]["layers"]["1"]
    assert layer["mean_shift"] == 0.0 and layer["var_ratio"] == 1.0  # the start is the --init-from weights


def test_a_gap_over_warn_gap_is_warned_and_reported(tiny_cfg, tmp_path, ecotrain_log):
    cfg = tiny_cfg(**{**_bn(policy="train", warn_gap=0.0), "data.batch_size": 4})
    r = fit(cfg, model=bn_mlp(), run_dir=tmp_path / "r")
    rep = r.summary["methods"]["batchnorm"]
    assert rep["warned"] and rep["train_mode_batch_size"] == 4 and rep["mode_gap"] != 0
    assert "inference will behave differently from training" in ecotrain_log.text
    text = format_report(read_report(tmp_path / "r"))
    assert "BatchNorm policy: train" in text and "gap" in text and text.splitlines()[-1].startswith("verdict: ")


def test_bn_report_of_a_run_without_the_method(tiny_cfg, tmp_path):
    fit(tiny_cfg(), run_dir=tmp_path / "r")
    with pytest.raises(ConfigError, match="without the batchnorm method"):
        read_report(tmp_path / "r")
    with pytest.raises(ConfigError, match="not a run folder"):
        read_report(tmp_path / "nope")
