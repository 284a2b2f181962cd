"""The data and schedule methods together in one real `ecotrain fit`: it trains, reports each
method, charges the ledger for the changed steps, and a SIGKILL + resume ends bit-identical."""

import json
import signal

import numpy as np
import pytest

from tests.helpers.runs import deterministic_lines, fit_quietly, write_recipe

METHODS = [
    {"name": "dedup"},
    {"name": "curriculum", "score": "file", "path": "SCORES", "epochs": 2},
    {"name": "batch_ramp", "lr_scaling": "sqrt", "start": 0.25, "steps": 12, "stages": 3},
    {"name": "progressive_resize", "scales": [0.5], "until": [0.3]},
    {"name": "selective_backprop", "keep": 0.5, "start_step": 5},
    {"name": "late_freeze", "freeze_depth": 1, "at": 0.75},
    {"name": "stability_stop", "window": 3, "tolerance": 1e-4},
]
RECIPE = {
    "name": "data_methods", "seed": 1,
    "data": {"name": "digits", "batch_size": 96, "val_split": 0.15, "augment": {"noise": 0.05}},
    "model": {"name": "resnet", "kwargs": {"widths": [4, 8]}, "dropout": 0.1},
    "optim": {"lr": 3e-3}, "schedule": {"name": "cosine", "warmup": 3},
    "loop": {"max_steps": 24, "max_epochs": None, "log_every": 4, "eval_every": 12},
    "checkpoint": {"every_n_steps": 4}, "ledger": {"energy": "off"}, "logging": {"progress": "off"},
}


def _recipe(d, callbacks=()):
    scores = d / "scores.npy"
    if not scores.exists():  # one score per train sample of digits' split (dedup drops none there)
        np.save(scores, np.random.default_rng(0).random(1222))
    methods = [dict(m, path=str(scores)) if m.get("path") == "SCORES" else m for m in METHODS]
    return write_recipe(d, dict(RECIPE, methods=methods, callbacks=list(callbacks)))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    d = tmp_path_factory.mktemp("ref")
    return fit_quietly(_recipe(d), d / "run")


def test_methods_report_and_the_ledger_remeasures(reference):
    s = json.loads((reference / "summary.json").read_text())
    m = s["methods"]
    assert m["dedup"]["samples"] == 1222 and m["dedup"]["kept"] == 1222 - m["dedup"]["exact_dropped"] - m["dedup"]["near_dropped"]
    assert m["batch_ramp"]["sizes"] == [24, 48, 72, 96] and m["batch_ramp"]["lr_scaling"] == "sqrt"
    assert m["selective_backprop"]["samples_backpropagated"] * 2 == m["selective_backprop"]["samples_scored"]
    assert m["late_freeze"]["at_step"] == 18 and m["late_freeze"]["frozen_tensors"] == 3
    flops = json.loads((reference / "ledger.json").read_text())["flops"]
    assert flops["remeasured"] >= 4  # ramp stages, the resize stage end, the freeze
    assert s["steps"] == 24 and s["epochs"] == 1  # epoch 1 (ordered too) starts at the step the ramp's sizes give


def test_sigkill_then_resume_is_bit_identical(cli, tmp_path, reference):
    run = tmp_path / "run"
    r = cli("fit", _recipe(tmp_path, [{"path": "tests.helpers.killer:KillAt", "kwargs": {"step": 10}}]),
            "--run-dir", run, "--quiet")
    assert r.returncode == -signal.SIGKILL, r.stderr
    r = cli("fit", _recipe(tmp_path), "--run-dir", run, "--resume", "auto", "--quiet", "--allow-config-change")
    assert r.returncode == 0, r.stderr
    assert "resuming from" in r.stderr
    assert (run / "model.safetensors").read_bytes() == (reference / "model.safetensors").read_bytes()
    assert deterministic_lines(run) == deterministic_lines(reference)  # losses, LRs and FLOPs, step by step
    a, b = (json.loads((p / "summary.json").read_text()) for p in (run, reference))
    assert a["methods"] == b["methods"] and a["test_accuracy"] == b["test_accuracy"]
