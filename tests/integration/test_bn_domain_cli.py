"""`batchnorm: {policy: domain}` end to end: a pre-trained run, a fine-tune on a shifted domain with
per-domain statistics, then the real `ecotrain eval|predict --domain` and an .npz `domain` column
serving both domains from one model, and `ecotrain bn-report`'s verdict."""

import csv
import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from ecotrain import Config, fit
from ecotrain.data import load_data
from ecotrain.base.errors import DataError
from ecotrain.export.inference import evaluate, load_trained, predict
from tests.conftest import run_cli

BASE = {"data": {"name": "digits", "batch_size": 32, "val_split": 0.15},
        "model": {"name": "resnet", "kwargs": {"widths": [8]}},
        "loop": {"max_steps": 30, "max_epochs": None, "eval_every": 10},
        "logging": {"progress": "off"}, "ledger": {"energy": "off"}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(pre-trained run, fine-tuned run, folder of the .npz files)."""
    root = tmp_path_factory.mktemp("domain")
    pre_cfg = Config.model_validate(BASE)
    fit(pre_cfg, run_dir=root / "pre", quiet=True)
    test = load_data(pre_cfg).test
    x, y = test.x.numpy(), test.y.numpy()
    np.savez(root / "shifted.npz", x=x * 2 + 1, y=y, x_test=x * 2 + 1, y_test=y)
    np.savez(root / "original.npz", x=x, y=y)
    np.savez(root / "mixed.npz", x=np.concatenate([x, x * 2 + 1]), y=np.concatenate([y, y]),
             domain=np.array(["original"] * len(y) + ["shifted"] * len(y)))
    cfg = Config.model_validate({**BASE, "data": {"name": "npz", "path": str(root / "shifted.npz"), "batch_size": 8},
                                 "loop": {"max_steps": 15, "max_epochs": None, "eval_every": 5},
                                 "methods": [{"name": "batchnorm", "policy": "domain", "domain": "shifted"}]})
    fit(cfg, run_dir=root / "ft", quiet=True, init_from=root / "pre" / "model.safetensors")
    return root / "pre", root / "ft", root


def test_eval_serves_each_domain_its_own_statistics(runs):
    pre, ft, files = runs
    summary = json.loads((ft / "summary.json").read_text())
    rec, _ = evaluate(ft, domain="shifted", out=files / "own.json")
    assert rec["bn_statistics"] == "shifted" and rec["accuracy"] == pytest.approx(summary["test_accuracy"])
    r = run_cli("eval", ft, "--data", files / "original.npz", "--domain", "somewhere-else", "--out", files / "o.json")
    assert r.returncode == 0, r.stderr
    orig = json.loads((files / "o.json").read_text())
    assert orig["bn_statistics"] == "pre-trained" and "pre-trained BatchNorm statistics" in r.stdout
    # an unknown domain runs the fine-tuned weights with the pre-trained run's statistics exactly
    model = load_trained(ft).model
    pre_w = load_file(pre / "model.safetensors")
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith(("running_mean", "running_var")):
                buf.copy_(pre_w[name])
        z = np.load(files / "original.npz")
        want = float((model(torch.from_numpy(z["x"]).float()).argmax(-1).numpy() == z["y"]).mean())
    assert orig["accuracy"] == pytest.approx(want)
    # a checkpoint serves the domains from its method state (the run's own from its model weights)
    ckpt = sorted((ft / "checkpoints").iterdir())[-1]
    assert evaluate(ckpt, [str(files / "original.npz")], domain="x")[0]["bn_statistics"] == "pre-trained"
    assert evaluate(ckpt, [str(files / "original.npz")], domain="shifted")[0]["bn_statistics"] == "shifted"


def test_a_domain_column_routes_each_row_and_predict_agrees(runs):
    _, ft, files = runs
    mixed, _ = evaluate(ft, [str(files / "mixed.npz")], out=files / "m.json")
    assert set(mixed["domains"]) == {"original", "shifted"} and mixed["domains"]["original"]["bn_statistics"] == "pre-trained"
    for key, name in (("original", "original.npz"), ("shifted", "shifted.npz")):
        alone, _ = evaluate(ft, [str(files / name)], "all", out=files / f"{key}.json", domain=key)
        assert mixed["domains"][key]["accuracy"] == pytest.approx(alone["accuracy"])
    n = mixed["samples"]
    assert mixed["accuracy"] == pytest.approx(sum(d["accuracy"] * d["samples"] for d in mixed["domains"].values()) / n)
    predict(ft, [str(files / "mixed.npz")], files / "m.csv")
    r = run_cli("predict", ft, "--data", files / "original.npz", "--domain", "original", "--out", files / "o.csv")
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(open(files / "m.csv")))
    alone = list(csv.DictReader(open(files / "o.csv")))
    assert [r["prob_3"] for r in rows[:len(alone)]] == [r["prob_3"] for r in alone]  # batch-split rows match
    assert [r["prob_3"] for r in rows[:len(alone)]] != [r["prob_3"] for r in rows[len(alone):]]


def test_domain_requests_that_cannot_be_served_are_one_line(runs):
    pre, ft, files = runs
    r = run_cli("eval", pre, "--domain", "shifted")
    assert r.returncode != 0 and "was not trained with per-domain BatchNorm statistics" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    np.savez(files / "bad.npz", x=np.zeros((3, 64), np.float32), y=np.zeros(3, np.int64), domain=np.zeros(2, np.int64))
    with pytest.raises(DataError, match="one integer or string domain key per row"):
        predict(ft, [str(files / "bad.npz")], files / "bad.csv")
    assert not (files / "bad.csv").exists()


def test_bn_report_shows_the_domains_and_a_verdict(runs):
    _, ft, _ = runs
    r = run_cli("bn-report", ft)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "BatchNorm policy: domain, domain shifted, statistics running"
    assert "domain shifted (this run):" in lines and "stem.1" in r.stdout
    assert lines[-1].startswith("verdict: ")
