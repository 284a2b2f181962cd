"""Tar shards through the real CLI with 2 loader workers: a SIGKILL mid-epoch resumes to the
uninterrupted run's bytes; a sample damaged after the last checkpoint stops the run in one line (exit
2) with every checkpoint untouched; `data.on_bad_shard: skip` finishes and counts what it left out."""

import json
import os
import signal

import pytest
import yaml

from tests.helpers.runs import deterministic_lines
from tests.helpers.tars import make_tar_shards
from tests.integration.test_workers_resume import _fit, _no_survivors

# 150 samples of 2 KiB a shard: 300 KiB, so the middle of a shard is outside the content hash's
# head and tail (docs/data.md) and a damaged sample there is found by reading it, not at start-up
SHARDS, PER_SHARD = 4, 150


def _recipe(tmp, data, callbacks=(), **data_keys):
    tree = {"name": "tars", "seed": 3,
            "data": {"name": f"shards:{data}", "batch_size": 32, "workers": 2, "shuffle_window": 128,
                     "val_split": 0.1, "test_split": 0.1, **data_keys},
            "model": {"name": "mlp", "kwargs": {"hidden": [16]}, "dropout": 0.1},
            "loop": {"max_steps": 30, "max_epochs": None, "log_every": 5, "eval_every": 10},
            "checkpoint": {"every_n_steps": 4}, "ledger": {"enabled": False}, "callbacks": list(callbacks)}
    p = tmp / f"recipe-{len(list(tmp.glob('recipe-*')))}.yaml"
    p.write_text(yaml.safe_dump(tree))
    return p


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tars")
    make_tar_shards(tmp / "data", shards=SHARDS, per_shard=PER_SHARD, dim=32)
    r = _fit(_recipe(tmp, tmp / "data"), "--run-dir", tmp / "ref")
    assert r.returncode == 0, r.stderr
    return tmp


def test_sigkilled_mid_epoch_resumes_to_the_same_bytes(setup, tmp_path):
    run = tmp_path / "run"
    r = _fit(_recipe(tmp_path, setup / "data", [{"path": "tests.helpers.killer:KillAt", "kwargs": {"step": 14}}]),
             "--run-dir", run)
    assert r.returncode == -signal.SIGKILL, r.stderr
    _no_survivors(str(tmp_path))
    r = _fit(_recipe(tmp_path, setup / "data"), "--run-dir", run, "--resume", "auto", "--allow-config-change")
    assert r.returncode == 0, r.stderr
    assert (run / "model.safetensors").read_bytes() == (setup / "ref" / "model.safetensors").read_bytes()
    assert deterministic_lines(run) == deterministic_lines(setup / "ref")


def _damage_middle(path):
    """Every sample's .npy magic in the middle third of the shard (its size kept: same content hash)."""
    data = bytearray(path.read_bytes())
    for s in range(PER_SHARD // 3, 2 * PER_SHARD // 3):
        at = s * 2048 + 512
        data[at:at + 6] = b"garbag"
    path.write_bytes(bytes(data))


def test_a_sample_damaged_mid_run_is_one_line_and_the_checkpoints_stay(setup, tmp_path):
    data = tmp_path / "data"
    make_tar_shards(data, shards=SHARDS, per_shard=PER_SHARD, dim=32)
    run = tmp_path / "run"
    r = _fit(_recipe(tmp_path, data), "--run-dir", run, "loop.max_steps=8")
    assert r.returncode == 0, r.stderr
    before = {p: p.read_bytes() for p in (run / "checkpoints").rglob("*") if p.is_file()}
    for shard in sorted(data.iterdir()):
        _damage_middle(shard)
    r = _fit(_recipe(tmp_path, data), "--run-dir", run, "--resume", "auto", "--allow-config-change")
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in r.stderr and len(lines) <= 3, r.stderr
    assert "cannot decode the .npy member" in r.stderr and "at byte" in r.stderr and ".tar sample '" in r.stderr
    after = {p: p.read_bytes() for p in (run / "checkpoints").rglob("*") if p.is_file()}
    assert all(after.get(p) == b for p, b in before.items())  # nothing lost
    _no_survivors(str(tmp_path))


def test_skip_finishes_and_counts_what_it_left_out(setup, tmp_path):
    data = tmp_path / "data"
    shards = make_tar_shards(data, shards=SHARDS, per_shard=PER_SHARD, dim=32)
    _damage_middle(shards[1])
    shards[3].write_bytes(shards[3].read_bytes()[: 2048 * 20 + 700])  # truncated in sample 20's payload
    run = tmp_path / "run"
    r = _fit(_recipe(tmp_path, data, on_bad_shard="skip"), "--run-dir", run)
    assert r.returncode == 0, r.stderr
    s = json.loads((run / "summary.json").read_text())["data_skipped"]
    assert list(s["shards"]) == [shards[3].name] and "truncated" in s["shards"][shards[3].name]
    assert s["samples"] == 1 and s["batch_reads"] > 0
    assert "left out" in r.stderr and os.path.basename(shards[1]) in r.stderr
