"""checkpoint/manager.py: which folders count as checkpoints and in what order, the newest valid
one, keep-last-K plus the best, background saves and their errors, the sweep of temporary folders
left by killed saves, and sharded saves through the manager."""

import json
import os
import subprocess
import sys

import pytest
import torch

from ecotrain.checkpoint import CheckpointManager, latest_valid, list_checkpoints, read_checkpoint
from ecotrain.checkpoint.manager import checkpoint_dir, stale_temporaries
from ecotrain.core.distributed import Dist
from ecotrain.base.errors import CheckpointError

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
DEAD_PID = 999_999_999  # above any pid_max: no such process


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def _state(step):
    return {"model/w": torch.full((2,), float(step))}, {"model": {"w": {"__tensor__": "model/w"}},
                                                       "position": {"step": step}}


def _save(m, step, **kw):
    return m.save(step, *_state(step), **kw)


def _names(run):
    return [p.name for p in list_checkpoints(run)]


def test_only_step_folders_count_newest_first_by_number(tmp_path):
    assert list_checkpoints(tmp_path) == []  # no checkpoints/ folder yet
    d = checkpoint_dir(tmp_path)
    assert d == tmp_path / "checkpoints"
    for name in ("step-9", "step-00000010", "step-5", "step-1x", "step-x5", "step-", "zzzzz12", "Step-7",
                 "step-\u0661\u0662", "step-\u0667", ".tmp-step-00000011-123"):
        (d / name).mkdir(parents=True)
    (d / "step-00000099").write_text("a file, not a folder")
    assert _names(tmp_path) == ["step-00000010", "step-9", "step-5"]


def test_latest_valid_skips_and_reports_broken_ones(tmp_path, ecotrain_log):
    m = CheckpointManager(tmp_path, keep_last=5)
    for step in (1, 2, 3):
        _save(m, step)
    (tmp_path / "checkpoints" / "step-00000003" / "MANIFEST.json").unlink()
    msgs = []
    assert latest_valid(tmp_path, msgs.append) == tmp_path / "checkpoints" / "step-00000002"
    assert msgs == [f"skipping checkpoint: {tmp_path / 'checkpoints' / 'step-00000003'}: incomplete checkpoint "
                    "(no MANIFEST.json); it was interrupted mid-save"]
    assert latest_valid(tmp_path) == tmp_path / "checkpoints" / "step-00000002"  # the default: the log
    assert "skipping checkpoint:" in ecotrain_log.text and "step-00000003" in ecotrain_log.text
    for p in list_checkpoints(tmp_path):
        (p / "meta.json").unlink()
    assert latest_valid(tmp_path, lambda msg: None) is None


def test_keep_last_two_by_default_plus_the_best(tmp_path):
    m = CheckpointManager(tmp_path / "new" / "run")  # the run folder need not exist yet
    assert _save(m, 1, is_best=True) == tmp_path / "new" / "run" / "checkpoints" / "step-00000001"
    for step in (2, 3, 4):
        _save(m, step)
    assert _names(tmp_path / "new" / "run") == ["step-00000004", "step-00000003", "step-00000001"]
    assert m.best == tmp_path / "new" / "run" / "checkpoints" / "step-00000001"
    _save(m, 5, is_best=True)
    assert _names(tmp_path / "new" / "run") == ["step-00000005", "step-00000004"]
    _save(m, 6)  # is_best defaults to False: the best stays step 5
    assert m.best.name == "step-00000005"
    assert _names(tmp_path / "new" / "run") == ["step-00000006", "step-00000005"]
    assert torch.equal(read_checkpoint(m.best)[0]["model/w"], torch.full((2,), 5.0))


def test_no_best_until_one_is_saved(tmp_path):
    m = CheckpointManager(tmp_path, keep_last=1)
    assert m.best is None
    for step in (1, 2):
        _save(m, step)
    assert m.best is None and _names(tmp_path) == ["step-00000002"]


def test_a_synchronous_save_fails_at_once(tmp_path):
    m = CheckpointManager(tmp_path)
    with pytest.raises(ValueError, match="expected torch.Tensor"):
        m.save(1, {"a": "not a tensor"}, {})
    m.wait()  # nothing left to report


def test_a_background_save_reports_its_error_at_the_next_wait(tmp_path):
    m = CheckpointManager(tmp_path, background=True)
    folder = m.save(1, {"a": "not a tensor"}, {})
    assert folder == tmp_path / "checkpoints" / "step-00000001"
    with pytest.raises(ValueError, match="expected torch.Tensor"):
        m.wait()
    m.wait()  # reported once
    _save(m, 2, is_best=True)
    _save(m, 3)  # waits for the save before
    m.wait()
    assert _names(tmp_path) == ["step-00000003", "step-00000002"] and m.best.name == "step-00000002"
    assert torch.equal(read_checkpoint(m.best)[0]["model/w"], torch.full((2,), 2.0))


def test_a_file_in_the_way_of_the_checkpoints_folder(tmp_path):
    (tmp_path / "checkpoints").write_text("x")
    m = CheckpointManager(tmp_path)
    with pytest.raises(CheckpointError) as err:
        _save(m, 1)
    assert str(err.value) == (f"could not create {tmp_path / 'checkpoints'}: File exists; free the path or the disk, "
                              "then resume")


@pytest.fixture
def live():
    code = "import signal, time; signal.signal(signal.SIGHUP, signal.SIG_DFL); time.sleep(60)"  # even under nohup
    p = subprocess.Popen([sys.executable, "-c", code])
    yield p
    p.kill()
    p.wait()


def test_stale_temporaries_are_those_of_dead_processes(tmp_path, live):
    live_pid = live.pid
    d = tmp_path / "checkpoints"
    names = {"dead": f".tmp-step-00000003-{DEAD_PID}", "mine": f".tmp-step-00000004-{os.getpid()}",
             "live": f".tmp-step-00000005-{live_pid}", "odd": ".tmp-step-00000006-abc",
             "other": f".tmp-other-{DEAD_PID}"}
    for n in names.values():
        (d / n).mkdir(parents=True)
    assert stale_temporaries(d) == [d / names["dead"]]
    with pytest.raises(subprocess.TimeoutExpired):  # asking whether a process lives sends it no signal
        live.wait(timeout=0.3)
    m = CheckpointManager(tmp_path)
    _save(m, 1)
    left = sorted(p.name for p in d.iterdir() if p.name.startswith("."))
    assert left == sorted(n for k, n in names.items() if k != "dead")
    (d / names["dead"]).mkdir()  # appears after the first save: only a killed earlier process leaves one
    _save(m, 2)
    assert (d / names["dead"]).is_dir()
    assert CheckpointManager(tmp_path)._swept is False


def test_a_sharded_save_through_the_manager(tmp_path):
    leftover = tmp_path / "checkpoints" / ".tmp-step-00000001-sharded" / "shards"
    leftover.mkdir(parents=True)  # a killed sharded save's folder: replaced
    (leftover / "junk").write_text("x")
    model = torch.nn.Linear(3, 2)
    shards = {"model/weight": model.weight.detach().clone(), "model/bias": model.bias.detach().clone()}
    skeleton = {"model": {"weight": {"__tensor__": "model/weight"}, "bias": {"__tensor__": "model/bias"}}}
    m = CheckpointManager(tmp_path, keep_last=1)
    rest = {"rng": {"__tensor__": "rng"}, "position": {"step": 1}, "sharded": skeleton}
    folder = m.save(1, {"rng": torch.arange(3)}, rest, is_best=True, shards=shards, dist=Dist())
    assert folder == tmp_path / "checkpoints" / "step-00000001" and m.best == folder
    tensors, meta = read_checkpoint(folder)
    assert torch.equal(tensors["rng"], torch.arange(3)) and meta["sharded"] == skeleton
    assert not (folder / "shards" / "junk").exists() and not leftover.parent.exists()
    manifest = json.loads((folder / "MANIFEST.json").read_text())
    assert any(n.startswith("shards/") and n.endswith(".safetensors") for n in manifest["files"])
    m.save(2, {"rng": torch.arange(3)}, {**rest, "position": {"step": 2}}, shards=shards, dist=Dist())
    assert m.best == folder and _names(tmp_path) == ["step-00000002", "step-00000001"]
    m.save(3, {"rng": torch.arange(3)}, {**rest, "position": {"step": 3}}, shards=shards, dist=Dist())
    assert _names(tmp_path) == ["step-00000003", "step-00000001"]
