"""Tar shards under real torchrun: 2 ranks x 2 loader workers train every sample exactly once in an
epoch (a model writes down the ids it trains on: tests/helpers/id_model.py), and so does a run
resized 2 -> 1 rank in the middle of that epoch."""

import yaml

from tests.distributed.test_torchrun import ENV, free_port, run_group, TORCHRUN
from tests.helpers.id_model import seen
from tests.helpers.tars import make_tar_shards

SHARDS, PER_SHARD, BATCH = 12, 16, 32  # 192 samples: 6 full global batches, nothing for the tail rule to drop


def fit(tmp_path, nproc, steps, ids, resume=False):
    rec = tmp_path / "ids.yaml"
    rec.write_text(yaml.safe_dump({
        "name": "ids", "seed": 4,
        "data": {"name": f"shards:{tmp_path / 'data'}", "batch_size": BATCH, "workers": 2, "shuffle_window": 64,
                 "val_split": 0, "test_split": 0},
        "model": {"name": "tests.helpers.id_model:IdRecorder", "kwargs": {"dim": 8, "classes": 4}},
        "loop": {"max_steps": steps, "max_epochs": None, "eval_every": 1000}, "distributed": {"strategy": "ddp"},
        "checkpoint": {"every_n_steps": 2}, "ledger": {"enabled": False}, "logging": {"progress": "off"}}))
    cmd = [*TORCHRUN, "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           "-m", "ecotrain", "fit", str(rec), "--run-dir", str(tmp_path / "run"), "--quiet",
           *(["--resume", "auto", "--allow-config-change"] if resume else [])]
    r = run_group(cmd, 240, env={**ENV, "ECOTRAIN_IDS_DIR": str(ids)})
    assert r.returncode == 0, r.stderr[-3000:]


def test_every_sample_once_per_epoch_across_ranks_workers_and_a_resize(tmp_path):
    make_tar_shards(tmp_path / "data", shards=SHARDS, per_shard=PER_SHARD, dim=8)
    ids = tmp_path / "ids"
    ids.mkdir()
    fit(tmp_path, 2, 2, ids)  # 2 ranks, 2 workers each: 2 of the epoch's 6 steps
    fit(tmp_path, 1, 6, ids, resume=True)  # the rest of the epoch on 1 rank
    got = seen(ids)
    assert sorted(got) == list(range(SHARDS * PER_SHARD))  # every id, each once
    assert len(list(ids.glob("ids-*.txt"))) == 3  # two ranks, then one
