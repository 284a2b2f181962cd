"""methods/batchnorm.py without a training run: the GroupNorm swap's edge cases, the policy object's
own state, and the bn report figure by figure (shifts, eval- vs train-mode accuracy, the warning) and
word for word (read_report's refusals, format_report's text)."""

import json
import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from ecotrain.config import BatchNormConfig, Config
from ecotrain.data import ArraySource
from ecotrain.base.errors import ConfigError
from ecotrain.methods.batchnorm import BatchNormPolicy, _why, format_report, read_report, to_groupnorm

CPU = torch.device("cpu")
DRIFTED = ("the running statistics have drifted from the batch statistics the weights were trained on (policy: "
           "recompute, or freeze_stats)")


def policy(**kw) -> BatchNormPolicy:
    return BatchNormPolicy(BatchNormConfig(name="batchnorm", **kw))


# -- the GroupNorm swap ---------------------------------------------------------------------------
def test_groupnorm_keeps_eps_affine_dtype_and_mode():
    model = nn.Sequential(nn.BatchNorm1d(4, eps=1e-2).double(), nn.Sequential(nn.BatchNorm1d(4, affine=False)))
    model[0].eval()
    with torch.no_grad():
        model[0].weight.fill_(2.0)
    out = to_groupnorm(model, 2)
    a, b = out[0], out[1][0]
    assert isinstance(a, nn.GroupNorm) and a.eps == 1e-2 and a.affine and a.weight.dtype == torch.float64
    assert torch.equal(a.weight, torch.full((4,), 2.0, dtype=torch.float64)) and not a.training
    assert isinstance(b, nn.GroupNorm) and not b.affine and b.weight is None and b.training and b.num_groups == 2


def test_a_model_that_is_itself_a_batchnorm():
    gn = to_groupnorm(nn.BatchNorm1d(6), 3)
    assert isinstance(gn, nn.GroupNorm) and gn.num_channels == 6 and gn.num_groups == 3
    with pytest.raises(ConfigError) as err:
        to_groupnorm(nn.BatchNorm1d(6), 4)
    assert str(err.value) == ("methods.batchnorm: groups=4 does not divide the 6 channels of BatchNorm layer "
                              "'(the model)'; choose a group count that divides every BatchNorm's channels "
                              "(largest here: 3)")


def test_when_only_one_group_divides_every_layer():
    with pytest.raises(ConfigError, match=r"groups=2 does not divide the 3 channels of BatchNorm layer '1'.*"
                                          r"\(largest here: 1\)$"):
        to_groupnorm(nn.Sequential(nn.BatchNorm1d(4), nn.BatchNorm1d(3)), 2)


# -- the policy object ----------------------------------------------------------------------------
def test_fsdp_is_refused():
    with pytest.raises(ConfigError) as err:
        BatchNormPolicy(BatchNormConfig(name="batchnorm"), Config.model_validate({"distributed": {"strategy": "fsdp"}}))
    assert str(err.value) == ("methods.batchnorm: not supported with distributed.strategy=fsdp (sharded modules); "
                              "use ddp or one process")
    assert BatchNormPolicy(BatchNormConfig(name="batchnorm"),
                           Config.model_validate({"distributed": {"strategy": "ddp"}})).policy == "train"


def test_a_fresh_policy_and_its_state():
    p = policy(policy="momentum", momentum=0.2)
    assert p.groups is None and p.layers == {} and p.start == {} and p.micro_batch == 32
    assert p.summary() == {"policy": "momentum"}
    assert p.state_dict() == {"policy": "momentum", "momentum": 0.2, "groups": None, "start": {}}
    g = policy(policy="groupnorm")
    assert g.groups == 32 and g.state_dict()["groups"] == 32 and policy(policy="groupnorm", groups=4).groups == 4
    p.train_mode(nn.Sequential(nn.BatchNorm1d(2)))  # nothing to freeze before transform


def test_transform_records_the_start_and_groupnorm_leaves_no_layers():
    model = nn.Sequential(nn.Linear(2, 8), nn.BatchNorm1d(8), nn.BatchNorm1d(8, track_running_stats=False))
    with torch.no_grad():
        model[1].running_mean.fill_(0.5)
    p = policy(policy="groupnorm", groups=4)
    out = p.transform(model)
    assert p.layers == {} and set(p.start) == {"1"} and torch.equal(p.start["1"]["mean"], torch.full((8,), 0.5))
    assert isinstance(out[1], nn.GroupNorm)
    with pytest.raises(ConfigError) as err:
        policy().transform(nn.Linear(2, 2))
    assert str(err.value) == ("methods.batchnorm: the model has no BatchNorm layers; drop the method "
                              "(or use a model with BatchNorm, e.g. model.name=resnet)")


def test_loading_another_policys_state_warns(ecotrain_log):
    p = policy(policy="train")
    start = {"1": {"mean": torch.zeros(2), "var": torch.ones(2)}}
    p.load_state_dict({"policy": "train", "start": start})
    assert "methods.batchnorm" not in ecotrain_log.text and p.start == start and p.start is not start
    p.load_state_dict({"policy": "recompute", "start": start})
    assert ("methods.batchnorm: the checkpoint's statistics were produced under policy recompute, this run uses "
            "train") in ecotrain_log.text


# -- the report's figures -------------------------------------------------------------------------
def test_shifts_figure_by_figure():
    model = nn.Sequential(nn.BatchNorm1d(3, eps=0.5), nn.BatchNorm1d(2), nn.BatchNorm1d(2))
    p = policy()
    p.transform(model)
    p.start.pop("0")  # a layer without a recorded start is left out, the layers after it are not
    with torch.no_grad():
        model[1].running_mean.copy_(torch.tensor([1.0, -2.0]))
        model[1].running_var.copy_(torch.tensor([3.0, 0.5]))
        model[1].eps = 0.5
    report = p._shifts({"0": model[0], "1": model[1], "2": model[2]})
    assert set(report) == {"1", "2"}
    shift = torch.tensor([1.0, 2.0]) / math.sqrt(1.5)
    ratio = math.exp((math.log(3.5 / 1.5) + math.log(1.0 / 1.5)) / 2)
    assert report["1"] == {"channels": 2, "mean_shift": round(float(shift.mean()), 4),
                           "max_mean_shift": round(float(shift.max()), 4), "var_ratio": round(ratio, 4)}
    assert report["1"]["mean_shift"] == 1.2247 and report["1"]["max_mean_shift"] == 1.633
    assert report["1"]["var_ratio"] == 1.2472
    assert report["2"] == {"channels": 2, "mean_shift": 0.0, "max_mean_shift": 0.0, "var_ratio": 1.0}


def _signs():
    """BN(1) then class 1 iff the normalised input is positive: exact in eval mode (running mean 0),
    wrong for some pairs in train mode (the pair's own mean); one label is wrong for both."""
    x = torch.tensor([1., 2, 3, 4, 5, 6, 7, -1, -2, -3, -4, -5, -6, -7]).view(-1, 1)
    y = (x[:, 0] > 0).long()
    y[0] = 0
    model = nn.Sequential(nn.BatchNorm1d(1), nn.Linear(1, 2))
    with torch.no_grad():
        model[1].weight.copy_(torch.tensor([[0.0], [1.0]]))
        model[1].bias.zero_()
    return model, ArraySource(x, y)


def _train_mode_accuracy(model, src, batch):
    order = torch.randperm(len(src), generator=torch.Generator().manual_seed(0))
    model.train()
    right = 0
    with torch.no_grad():
        for start in range(0, len(src), batch):
            x, y = src.take(order[start:start + batch])
            right += int((model(x).argmax(-1) == y).sum())
    return right / len(src)


def test_eval_and_train_mode_accuracy_and_the_warning(ecotrain_log):
    model, val = _signs()
    train_acc = _train_mode_accuracy(_signs()[0], val, 2)
    eval_acc = 13 / 14
    assert train_acc < eval_acc
    gap = train_acc - eval_acc
    p = policy(warn_gap=abs(gap))  # exactly at warn_gap: no warning
    p.transform(model)
    p.micro_batch = 2
    p.finalize(model, SimpleNamespace(train=None, val=val))
    assert p.report == {"policy": "train", "layers": {"0": {"channels": 1, "mean_shift": 0.0, "max_mean_shift": 0.0,
                                                            "var_ratio": 1.0}},
                        "val_accuracy_eval_mode": round(eval_acc, 4), "val_accuracy_train_mode": round(train_acc, 4),
                        "mode_gap": round(gap, 4), "train_mode_batch_size": 2, "warn_gap": abs(gap), "warned": False}
    assert p.report["val_accuracy_eval_mode"] == 0.9286 and p.summary() is p.report
    assert torch.equal(model[0].running_mean, torch.zeros(1)) and model[0].num_batches_tracked == 0  # put back

    ecotrain_log.clear()
    p.warn_gap = abs(round(gap, 4))  # the log compares the report's rounded gap: at warn_gap, no warning
    p.finalize(model, SimpleNamespace(train=None, val=val))
    assert p.report["warned"] is False and "methods.batchnorm" not in ecotrain_log.text

    p.warn_gap = 0.01
    p.finalize(model, SimpleNamespace(train=None, val=val))
    assert p.report["warned"] is True
    assert (f"methods.batchnorm: validation accuracy {eval_acc:.4f} in eval mode vs {train_acc:.4f} in train mode "
            f"(gap {gap:+.4f}, more than warn_gap 0.01): inference will behave differently from training; "
            "batch statistics of 2 samples are noisier than the running ones, so the weights were trained on noisy "
            "normalisation (policy: freeze_stats, or groupnorm); see `ecotrain bn-report RUN` and "
            "docs/finetuning.md") in ecotrain_log.text


def test_the_default_train_mode_batch_and_frozen_statistics():
    model, val = _signs()
    p = policy(policy="freeze_stats", warn_gap=0.0)
    p.transform(model)
    p.finalize(model, SimpleNamespace(train=None, val=val))
    assert p.report["train_mode_batch_size"] == 32 and p.report["mode_gap"] == 0.0 and p.report["warned"] is False


def test_a_report_without_validation_data_per_policy(ecotrain_log):
    model = nn.Sequential(nn.Linear(2, 4), nn.BatchNorm1d(4))
    p = policy(policy="momentum", momentum=0.5, warn_gap=0.0)
    p.transform(model)
    p.finalize(model, SimpleNamespace(train=None, val=None))
    assert p.report == {"policy": "momentum", "momentum": 0.5,
                        "layers": {"1": {"channels": 4, "mean_shift": 0.0, "max_mean_shift": 0.0, "var_ratio": 1.0}}}
    g = policy(policy="groupnorm", groups=2)
    model = g.transform(nn.Sequential(nn.Linear(2, 4), nn.BatchNorm1d(4), nn.BatchNorm1d(4)))
    g.finalize(model, SimpleNamespace(train=None, val=None))
    assert g.report == {"policy": "groupnorm", "groups": 2, "groupnorm_layers": 2, "layers": {}}
    r = policy(policy="recompute", recompute_batch_size=4)
    model = r.transform(nn.Sequential(nn.Linear(2, 4), nn.BatchNorm1d(4)))
    r.finalize(model, SimpleNamespace(train=ArraySource(torch.randn(10, 2), torch.zeros(10, dtype=torch.long)), val=None))
    assert r.report["recomputed_on_samples"] == 10 and "momentum" not in r.report and "groups" not in r.report
    assert "methods.batchnorm" not in ecotrain_log.text


def test_why_each_sign():
    assert _why(0.5, 8) == DRIFTED and _why(1.5, 8) == DRIFTED
    assert _why(0.0, 8) == ("batch statistics of 8 samples are noisier than the running ones, so the weights were "
                            "trained on noisy normalisation (policy: freeze_stats, or groupnorm)")


# -- ecotrain bn-report ---------------------------------------------------------------------------
def test_read_report_refusals(tmp_path):
    with pytest.raises(ConfigError) as err:
        read_report(tmp_path / "nope")
    assert str(err.value) == f"{tmp_path / 'nope'}: not a run folder (not found)"
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError) as err:
        read_report(tmp_path / "f")
    assert str(err.value) == f"{tmp_path / 'f'}: not a run folder (a file)"
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(ConfigError) as err:
        read_report(run)
    assert str(err.value) == f"{run}: not a finished run folder (no summary.json)"
    (run / "summary.json").write_text("{oops")
    with pytest.raises(ConfigError) as err:
        read_report(run)
    assert str(err.value) == f"{run / 'summary.json'}: not readable JSON (JSONDecodeError)"
    for summary in ([1], {"methods": {"ewc": {}}}, {"methods": {"batchnorm": 3}}):
        (run / "summary.json").write_text(json.dumps(summary))
        with pytest.raises(ConfigError) as err:
            read_report(run)
        assert str(err.value) == (f"{run}: the run was trained without the batchnorm method, so there is no bn report; "
                                  "add `methods: [{name: batchnorm, policy: train}]` to its recipe")
    (run / "summary.json").write_text(json.dumps({"methods": {"batchnorm": {"policy": "train", "é": 1}}}))
    assert read_report(run) == {"policy": "train", "é": 1}


def test_format_report_word_for_word():
    r = {"policy": "recompute", "momentum": 0.01, "groups": 4, "recomputed_on_samples": 100,
         "layers": {"stem.1": {"channels": 8, "mean_shift": 0.12345, "max_mean_shift": 1.5, "var_ratio": 0.9},
                    "b": {"channels": 16, "mean_shift": 2.0, "max_mean_shift": 3.25, "var_ratio": 1.1}},
         "val_accuracy_eval_mode": 0.8, "val_accuracy_train_mode": 0.75, "train_mode_batch_size": 16,
         "mode_gap": -0.05, "warn_gap": 0.01, "warned": True}
    assert format_report(r) == "\n".join([
        "BatchNorm policy: recompute, momentum 0.01, groups 4, recomputed on 100",
        "layer   channels  mean_shift  max_mean_shift  var_ratio",
        "stem.1         8      0.1235          1.5000     0.9000",
        "b             16      2.0000          3.2500     1.1000",
        "(shift from the starting weights: mean_shift in starting standard deviations; var_ratio 1 = unchanged)",
        "validation accuracy: eval mode 0.8000, train mode 0.7500 (batch 16), gap -0.0500",
        "verdict: train-mode accuracy (batch 16) is 0.0500 below eval-mode on the validation split: batch statistics "
        "that small are noisy, not drift; try freeze_stats or groupnorm (docs/finetuning.md)"])
    drift = {**r, "val_accuracy_train_mode": 0.9, "mode_gap": 0.1}
    assert format_report(drift).splitlines()[-1] == (
        "verdict: eval-mode accuracy is 0.1000 below train-mode on the validation split: drift; try recompute or "
        "domain statistics (docs/finetuning.md)")


def test_format_report_of_a_groupnorm_run_without_validation():
    assert format_report({"policy": "groupnorm", "groups": 8, "groupnorm_layers": 3, "layers": {}}) == "\n".join([
        "BatchNorm policy: groupnorm, groups 8",
        "3 BatchNorm layers were swapped for GroupNorm: no running statistics",
        "verdict: not measured (no validation split, or not a classification task)"])
    assert format_report({"policy": "train", "groupnorm_layers": 0, "layers": None}) == "\n".join([
        "BatchNorm policy: train",
        "verdict: not measured (no validation split, or not a classification task)"])
    unwarned = {"policy": "train", "layers": {"a": {"channels": 1, "mean_shift": 0, "max_mean_shift": 0, "var_ratio": 1}},
                "val_accuracy_eval_mode": 1.0, "val_accuracy_train_mode": 1.0, "train_mode_batch_size": 4,
                "mode_gap": 0.0, "warn_gap": 0.05, "warned": False}
    assert format_report(unwarned).splitlines()[1:] == [
        "layer  channels  mean_shift  max_mean_shift  var_ratio",
        "a             1      0.0000          0.0000     1.0000",
        "(shift from the starting weights: mean_shift in starting standard deviations; var_ratio 1 = unchanged)",
        "validation accuracy: eval mode 1.0000, train mode 1.0000 (batch 4), gap +0.0000",
        "verdict: no drift: eval-mode and train-mode accuracy on the validation split are within warn_gap 0.05 "
        "(gap +0.0000)"]


def test_format_report_of_a_domain_run_shows_each_domains_statistics():
    table = {"1": {"channels": 16, "mean_shift": 0.5, "max_mean_shift": 1.0, "var_ratio": 2.0}}
    r = {"policy": "domain", "domain": "b", "domain_stats": "running", "layers": table,
         "domains": {"a": {"1": {**table["1"], "mean_shift": 0.25}}, "b": table}}
    assert format_report(r) == "\n".join([
        "BatchNorm policy: domain, domain b, statistics running",
        "domain a (carried over):",
        "layer  channels  mean_shift  max_mean_shift  var_ratio",
        "1            16      0.2500          1.0000     2.0000",
        "domain b (this run):",
        "layer  channels  mean_shift  max_mean_shift  var_ratio",
        "1            16      0.5000          1.0000     2.0000",
        "(domains: shift from the pre-trained statistics, which any other domain key is served with)",
        "verdict: not measured (no validation split, or not a classification task)"])
