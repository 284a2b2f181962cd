"""metrics.jsonl lines are durable as they are written: a real `ecotrain fit` killed with SIGKILL
between two checkpoints keeps every step it logged, and the resume counts the steps it trains again
(summary.json `steps_redone`)."""

import json
import signal

from tests.helpers.runs import write_recipe

RECIPE = {
    "name": "durable_metrics", "seed": 1,
    "data": {"name": "digits", "batch_size": 32, "val_split": 0.15},
    "model": {"name": "mlp", "kwargs": {"hidden": [16]}},
    "loop": {"max_steps": 24, "max_epochs": None, "log_every": 1, "eval_every": 100},  # no evaluation flushes
    "checkpoint": {"every_n_steps": 10},
    "logging": {"progress": "off"},
    "ledger": {"enabled": False},
}


def steps(run) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()
            if "step" in json.loads(line) and "loss" in json.loads(line)]


def test_sigkill_between_checkpoints_loses_no_logged_step_and_counts_the_redone(cli, tmp_path):
    run = tmp_path / "run"
    killer = {"path": "tests.helpers.killer:KillAt", "kwargs": {"step": 15}}  # checkpoint at 10; 11..15 logged
    r = cli("fit", write_recipe(tmp_path, dict(RECIPE, callbacks=[killer])), "--run-dir", run, "--quiet")
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert steps(run) == list(range(1, 16))  # the kill lost no line: each one reached the OS as written

    r = cli("fit", write_recipe(tmp_path, RECIPE), "--run-dir", run, "--resume", "auto", "--quiet",
            "--allow-config-change")
    assert r.returncode == 0, r.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumes"] == 1 and summary["steps_redone"] == 5, summary
    assert steps(run) == list(range(1, 25))  # the killed segment's lines past step 10 were cut once, then redone
