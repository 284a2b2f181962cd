"""Replay + EWC + LwF from a previous version, through the real CLI: SIGKILL mid-run, resume, and
the final weights, the exported buffer/Fisher and the logged terms equal an uninterrupted run's."""

import json
import signal

import pytest

from tests.helpers.runs import deterministic_lines, write_recipe


def _recipe(tmp_path, base, callbacks=()):
    prev = str(base)
    tree = {
        "name": "continual_resume", "seed": 3,
        "data": {"name": "digits", "batch_size": 32, "val_split": 0.15, "num_classes": 10},
        "model": {"name": "mlp", "kwargs": {"hidden": [32]}, "dropout": 0.2},
        "optim": {"lr": 3e-3},
        "loop": {"max_steps": 30, "max_epochs": None, "log_every": 5, "eval_every": 10},
        "checkpoint": {"every_n_steps": 4},
        "ledger": {"enabled": False},
        "methods": [{"name": "replay", "size": 40, "hard_weight": 2.0, "from": prev},
                    {"name": "ewc", "beta": 10.0, "samples": 64, "from": prev},
                    {"name": "lwf", "teacher": prev, "alpha": 0.5}],
        "callbacks": list(callbacks),
    }
    return write_recipe(tmp_path, tree)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """The previous version, trained in-process with replay and EWC (its buffer and Fisher exported)."""
    from ecotrain import fit
    from ecotrain.config import build_config

    d = tmp_path_factory.mktemp("base")
    cfg = build_config({"seed": 1, "data": {"name": "digits", "batch_size": 32, "num_classes": 10},
                        "model": {"name": "mlp", "kwargs": {"hidden": [32]}},
                        "loop": {"max_steps": 12, "max_epochs": None, "eval_every": 12},
                        "ledger": {"enabled": False}, "logging": {"progress": "off"},
                        "methods": [{"name": "replay", "size": 40}, {"name": "ewc", "samples": 64}]})
    fit(cfg, run_dir=d / "v0", quiet=True)
    return d / "v0"


def test_sigkill_then_resume_is_bit_identical(cli, tmp_path, base):
    ref, run = tmp_path / "ref", tmp_path / "run"
    r = cli("fit", _recipe(tmp_path, base), "--run-dir", ref, "--init-from", base, "--quiet")
    assert r.returncode == 0, r.stderr
    # killed at 26, resumed from the step-24 checkpoint, inside a log window (21-25): the checkpoint
    # holds that window of the loss and of every named term, so the step-25 line is the same
    killer = {"path": "tests.helpers.killer:KillAt", "kwargs": {"step": 26}}
    r = cli("fit", _recipe(tmp_path, base, [killer]), "--run-dir", run, "--init-from", base, "--quiet")
    assert r.returncode == -signal.SIGKILL, r.stderr
    r = cli("fit", _recipe(tmp_path, base), "--run-dir", run, "--init-from", base, "--resume", "auto", "--quiet",
            "--allow-config-change")
    assert r.returncode == 0, r.stderr
    assert "resuming from" in r.stderr
    for f in ("model.safetensors", "export.safetensors"):
        assert (run / f).read_bytes() == (ref / f).read_bytes(), f
    assert deterministic_lines(run) == deterministic_lines(ref)
    terms = [_terms(p) for p in (run, ref)]
    assert terms[0] == terms[1] and len(terms[0]) == 6  # every logged term, every log line
    assert all(x["loss_replay"] > 0 and x["loss_ewc"] > 0 and x["loss_lwf"] > 0 for x in terms[0][1:])


def _terms(run):
    lines = (json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines())
    return [{k: v for k, v in x.items() if k.startswith("loss_")} for x in lines if "loss" in x]
