"""Distillation from a cached teacher with structured pruning, through the real CLI: it trains, the
ledger counts the teacher and the shrinking, a SIGKILL'd run resumes to the same bytes, and the
pruned run folder rebuilds as the small model."""

import json
import signal

import pytest
import yaml

from tests.helpers.runs import deterministic_lines

BASE = {
    "seed": 5, "data": {"name": "digits", "batch_size": 32, "val_split": 0.15},
    "optim": {"lr": 3e-3}, "loop": {"max_steps": 30, "max_epochs": None, "log_every": 5, "eval_every": 10},
    "logging": {"progress": "off"}, "ledger": {"energy": "off"}, "checkpoint": {"every_n_steps": 5},
}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A teacher (made with the Python API), the student's recipe and its uninterrupted run."""
    from conftest import run_cli

    from ecotrain import Config, fit

    d = tmp_path_factory.mktemp("model-methods")
    fit(Config.model_validate({**BASE, "model": {"name": "mlp", "kwargs": {"hidden": [64]}}}), run_dir=d / "teacher")
    student = {**BASE, "name": "student", "model": {"name": "cnn", "kwargs": {"channels": 12}},
               "methods": [{"name": "distill", "teacher": str(d / "teacher"), "alpha": 0.7},
                           {"name": "prune", "kind": "structured", "amount": 0.5, "end_step": 20, "every": 10}]}
    recipe = d / "student.yaml"
    recipe.write_text(yaml.safe_dump(student))
    r = run_cli("fit", recipe, "--run-dir", d / "ref", "--quiet")
    assert r.returncode == 0, r.stderr
    return d, recipe, student


def test_distilled_pruned_run_counts_its_costs(setup):
    d, _, _ = setup
    s = json.loads((d / "ref" / "summary.json").read_text())
    flops = json.loads((d / "ref" / "ledger.json").read_text())["flops"]
    teacher = json.loads((d / "teacher" / "ledger.json").read_text())["flops"]["total"]
    assert s["methods"]["distill"]["teacher_cost_included"] is True
    assert flops["extra"]["distill.teacher_training"] == teacher and flops["extra"]["distill.teacher_cache"] > 0
    p = s["methods"]["prune"]
    assert p["sparsity"] == 0.5 and flops["remeasured"] == 2  # two shrinking stages, each measured again
    assert flops["forward_per_sample"] == p["forward_flops_per_sample_after"] < p["forward_flops_per_sample_before"]
    assert "loss_kd" in (d / "ref" / "metrics.jsonl").read_text()
    from ecotrain.export.inference import load_trained

    from ecotrain.core.loop import evaluate
    from ecotrain.core.task import ClassificationTask

    t = load_trained(d / "ref", "cpu")  # the run folder rebuilds as the physically small model
    assert t.model.conv1.weight.shape == (6, 1, 5) and t.model.linear.in_features == 6 * 8  # 12 channels -> 6
    m = evaluate(t.model, t.bundle.test, ClassificationTask(), 256, t.device, prefix="test")
    assert m["test_accuracy"] == s["test_accuracy"]


def test_sigkill_resumes_bit_exact(setup, cli):
    d, recipe, student = setup
    killed = d / "killed.yaml"
    killed.write_text(yaml.safe_dump({**student, "callbacks": [{"path": "tests.helpers.killer:KillAt",
                                                                  "kwargs": {"step": 17}}]}))
    run = d / "cut"
    r = cli("fit", killed, "--run-dir", run, "--quiet")
    assert r.returncode == -signal.SIGKILL, r.stderr
    r = cli("fit", recipe, "--run-dir", run, "--resume", "auto", "--quiet", "--allow-config-change")
    assert r.returncode == 0 and "step-00000015" in r.stderr, r.stderr
    assert (run / "model.safetensors").read_bytes() == (d / "ref" / "model.safetensors").read_bytes()
    assert deterministic_lines(run) == deterministic_lines(d / "ref")
    a, b = (json.loads((p / "summary.json").read_text()) for p in (run, d / "ref"))
    assert a["test_accuracy"] == b["test_accuracy"] and a["methods"] == b["methods"]
