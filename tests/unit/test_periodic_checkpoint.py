"""A run checkpoints every few minutes by default (checkpoint.every_minutes), never spending more than
~1% of its time saving: a SIGKILL loses minutes, not the run."""

from types import SimpleNamespace

import pytest

from ecotrain import Config, fit
from ecotrain.callbacks import checkpointing
from ecotrain.callbacks.checkpointing import Checkpointer


def test_due_after_the_interval_stretched_by_slow_saves(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(checkpointing.time, "monotonic", lambda: clock[0])
    cp = Checkpointer(None, SimpleNamespace(every_minutes=10.0), None)
    clock[0] += 599.0
    assert not cp.due()
    clock[0] += 1.0
    assert cp.due()  # exactly 10 minutes
    cp.last_save_at, cp.save_seconds = clock[0], 9.0  # a save took 9 s: 1% of 900 s, so 15 minutes
    clock[0] += 899.0
    assert not cp.due()
    clock[0] += 1.0
    assert cp.due()
    assert not Checkpointer(None, SimpleNamespace(every_minutes=None), None).due()
    assert Config().checkpoint.every_minutes == 10.0  # on by default


def test_periodic_saves_in_a_real_run(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpointing, "SAVE_SHARE", 1.0)  # saving may take all the time: a save every few steps
    cfg = Config.model_validate({
        "name": "t", "data": {"name": "digits", "batch_size": 32}, "model": {"name": "mlp", "kwargs": {"hidden": [16]}},
        "loop": {"max_steps": 400, "max_epochs": None, "log_every": 100}, "logging": {"progress": "off"},
        "ledger": {"enabled": False}, "checkpoint": {"every_minutes": 1e-6, "at_end": False, "keep_last": 100}})
    fit(cfg, run_dir=tmp_path / "run", quiet=True)
    saved = sorted(int(p.name[5:]) for p in (tmp_path / "run" / "checkpoints").glob("step-*"))
    # no every_n_steps, no at_end: the clock saved them, the first at step 1, the next ones spaced out
    # by at least the time a save takes (SAVE_SHARE), so fewer than one per step
    assert saved[0] == 1 and 3 <= len(saved) < 400, saved


def test_every_minutes_validated():
    from ecotrain.base.errors import ConfigError
    from ecotrain.config import build_config

    with pytest.raises(ConfigError, match="every_minutes"):
        build_config({"checkpoint": {"every_minutes": 0}})
