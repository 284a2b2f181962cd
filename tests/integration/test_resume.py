"""Kill a real `ecotrain fit` with real signals, resume, and compare bytes with an uninterrupted run."""

import json
import random
import signal

import pytest
import yaml

from tests.helpers.runs import deterministic_lines, fit_quietly, write_recipe

RECIPE = {
    "name": "resume_test", "seed": 3,
    "data": {"name": "digits", "batch_size": 32, "val_split": 0.15, "augment": {"noise": 0.05, "scale": 0.1}},
    "model": {"name": "mlp", "kwargs": {"hidden": [32]}, "dropout": 0.2},  # dropout: the torch RNG matters
    "optim": {"lr": 3e-3, "weight_decay": 0.01},
    "schedule": {"name": "cosine", "warmup": 5},
    "loop": {"max_steps": 70, "max_epochs": None, "log_every": 5, "eval_every": 10},
    "early_stopping": {"enabled": True, "monitor": "val_accuracy", "mode": "max", "patience": 50},
    "checkpoint": {"every_n_steps": 4},
}


def _recipe(tmp_path, callbacks=()):
    return write_recipe(tmp_path, dict(RECIPE, callbacks=list(callbacks)))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run."""
    d = tmp_path_factory.mktemp("ref")
    return fit_quietly(_recipe(d), d / "run")


def _same_as_reference(run, reference):
    assert (run / "model.safetensors").read_bytes() == (reference / "model.safetensors").read_bytes()
    assert deterministic_lines(run) == deterministic_lines(reference)
    a, b = (json.loads((p / "summary.json").read_text()) for p in (run, reference))
    for k in ("test_accuracy", "best_val_metric", "best_step", "steps", "val_loss"):
        assert a[k] == b[k], k


def _kill_then_resume(cli, tmp_path, reference, callback, expect_rc):
    run = tmp_path / "run"
    recipe = _recipe(tmp_path, [callback])
    r = cli("fit", recipe, "--run-dir", run, "--quiet")
    assert r.returncode == expect_rc, (r.returncode, r.stderr)
    # the restarted job: same command with --resume auto, without the killer
    r = cli("fit", _recipe(tmp_path), "--run-dir", run, "--resume", "auto", "--quiet", "--allow-config-change")
    assert r.returncode == 0, r.stderr
    return run, r


@pytest.mark.parametrize("step", sorted(random.Random(20261202).sample(range(2, 69), 3)))
def test_sigkill_at_random_step_resumes_bit_exact(cli, tmp_path, reference, step):
    run, r = _kill_then_resume(cli, tmp_path, reference,
                               {"path": "tests.helpers.killer:KillAt", "kwargs": {"step": step}}, -signal.SIGKILL)
    assert ("resuming from" in r.stderr) == (step >= 4)
    _same_as_reference(run, reference)


def test_sigkill_during_a_save_keeps_previous_checkpoint(cli, tmp_path, reference):
    run = tmp_path / "run"
    r = cli("fit", _recipe(tmp_path, [{"path": "tests.helpers.killer:KillDuringSave", "kwargs": {"step": 30}}]),
            "--run-dir", run, "--quiet")
    assert r.returncode == -signal.SIGKILL, r.stderr
    leftovers = [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith(".tmp-")]
    assert leftovers, "the kill did not land inside a save"
    r = cli("fit", _recipe(tmp_path), "--run-dir", run, "--resume", "auto", "--quiet", "--allow-config-change")
    assert r.returncode == 0, r.stderr
    _same_as_reference(run, reference)
    # the killed save's temporary folder is gone: the resumed run's first save removed it (its pid is dead)
    assert not [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith(".tmp-")]


def test_sigterm_checkpoints_exits_75_and_resumes_exact(cli, tmp_path, reference):
    run, r = _kill_then_resume(cli, tmp_path, reference,
                               {"path": "tests.helpers.killer:KillAt", "kwargs": {"step": 37, "sig": "SIGTERM"}}, 75)
    assert "resuming from" in r.stderr and "step-00000037" in r.stderr  # the preemption checkpoint
    _same_as_reference(run, reference)


def test_sigterm_during_evaluation_checkpoints_and_resumes_exact(cli, tmp_path, reference):
    run, r = _kill_then_resume(cli, tmp_path, reference,
                               {"path": "tests.helpers.killer:SigtermDuringEval", "kwargs": {"nth": 3}}, 75)
    assert "step-00000030" in r.stderr  # the third validation pass is step 30's: its checkpoint, then exit 75
    _same_as_reference(run, reference)


def test_sigterm_during_a_save_finishes_it_then_checkpoints_and_resumes_exact(cli, tmp_path, reference):
    run, r = _kill_then_resume(cli, tmp_path, reference, {"path": "tests.helpers.killer:KillDuringSave",
                                                            "kwargs": {"step": 30, "sig": "SIGTERM"}}, 75)
    # the signal lands inside step 32's save (every 4 steps), which completes; step 33 ends with the
    # preemption checkpoint, which the resume starts from
    assert "step-00000033" in r.stderr, r.stderr
    _same_as_reference(run, reference)


def test_resume_command_continues_a_preempted_run(cli, tmp_path, reference):
    run = tmp_path / "run"
    r = cli("fit", _recipe(tmp_path, [{"path": "tests.helpers.killer:KillAt", "kwargs": {"step": 21, "sig": "SIGINT"}}]),
            "--run-dir", run, "--quiet")
    assert r.returncode == 75 and "ecotrain resume" in r.stdout
    # `ecotrain resume` reads the run's config.yaml, which names the killer: drop it as a user would
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["callbacks"] = []
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    r = cli("resume", run, "--quiet", "--allow-config-change")
    assert r.returncode == 0, r.stderr
    _same_as_reference(run, reference)


def test_two_sigints_during_a_save_leave_no_partial_folder_and_resume_exact(cli, tmp_path, reference):
    """The second Ctrl-C stops at once, from inside step 32's save: exit 130, the temporary folder
    removed, one line naming the checkpoint to resume from (it said only "interrupted")."""
    run = tmp_path / "run"
    r = cli("fit", _recipe(tmp_path, [{"path": "tests.helpers.interrupt:SigintTwiceDuringSave",
                                       "kwargs": {"step": 30}}]), "--run-dir", run, "--quiet")
    assert r.returncode == 130, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last == (f"ecotrain: interrupted (a second Ctrl-C stops at once, without a checkpoint); checkpoint "
                    f"step-00000028 is intact: `ecotrain resume {run}` continues from it"), r.stderr
    assert "Traceback" not in r.stderr
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-00000024", "step-00000028"]
    r = cli("fit", _recipe(tmp_path), "--run-dir", run, "--resume", "auto", "--quiet", "--allow-config-change")
    assert r.returncode == 0, r.stderr
    assert "step-00000028" in r.stderr
    _same_as_reference(run, reference)
