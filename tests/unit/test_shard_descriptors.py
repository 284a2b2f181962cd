"""One descriptor budget for shards (data/openfiles.py): shards open when first read, the most recently
used few stay open, so any number of shards trains under a low `ulimit -n` (10,000 shards at 1024
failed with "Too many open files": one descriptor was kept per shard). Checked with a real
RLIMIT_NOFILE set in the child process, over a few thousand tiny shards."""

import os
import resource
import subprocess
import sys

import pytest
import torch

from ecotrain.config import Config
from ecotrain.data import openfiles
from ecotrain.data.openfiles import OpenFiles
from ecotrain.data.shards import load_shards
from tests.conftest import ROOT
from tests.helpers.tars import member, npy_bytes, raw_tar

pytestmark = pytest.mark.unit


def test_the_least_recently_used_file_is_closed_beyond_the_budget():
    opened, closed = [], []
    files = OpenFiles(lambda i: opened.append(i) or f"h{i}", closed.append, limit=3)
    for i in (0, 1, 2, 0, 3, 4, 0):
        assert files.get(i) == f"h{i}"
    assert opened == [0, 1, 2, 3, 4] and closed == ["h1", "h2"] and len(files) == 3
    files._pid = -1  # as in a forked loader worker: its copies are closed, its own opened
    files.get(4)
    assert closed == ["h1", "h2", "h3", "h4", "h0"] and opened[-1] == 4 and len(files) == 1
    files.close()
    assert len(files) == 0


def test_the_budget_follows_a_low_limit(monkeypatch):
    monkeypatch.setattr(openfiles.resource, "getrlimit", lambda what: (256, 4096))
    assert openfiles.budget() == 16
    monkeypatch.setattr(openfiles.resource, "getrlimit", lambda what: (1 << 20, 1 << 20))
    assert openfiles.budget() == openfiles.MOST
    monkeypatch.setattr(openfiles.resource, "getrlimit", lambda what: (20, 20))
    assert openfiles.budget() == 2


def _shards(folder, n):
    folder.mkdir()
    for i in range(n):  # one sample of 4 features a shard: 2.5 KiB each
        (folder / f"s-{i:05d}.tar").write_bytes(raw_tar(member(f"{i:05d}.npy", npy_bytes([i, 1.0, 2.0, 3.0])),
                                                        member(f"{i:05d}.cls", str(i % 3).encode())))


def test_a_read_across_every_shard_keeps_to_the_budget(tmp_path):
    _shards(tmp_path / "s", 200)
    src = load_shards(str(tmp_path / "s"), Config.model_validate({"data": {"name": "shards:x"}}).data)
    src._fds.limit = 8
    before = _fds()
    x, _ = src.take(torch.arange(200))
    assert x[:, 0].tolist() == list(range(200)) and len(src._fds) == 8
    assert before is None or _fds() <= before + 8


def _low(limit):
    def lower():
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    return lower


def test_thousands_of_shards_train_under_a_low_ulimit(tmp_path):
    """1,500 shards under `ulimit -n 96`, with a loader worker: every shard is read in the run (6
    batches of 500 over 1,350 training samples) and no process holds more than a few (96 / 16)."""
    _shards(tmp_path / "s", 1_500)
    (tmp_path / "r.yaml").write_text(f"""\
name: many
data: {{name: "shards:{tmp_path / 's'}", batch_size: 500, val_split: 0.1, test_split: 0.0, workers: 1}}
model: {{name: mlp, kwargs: {{hidden: [8]}}}}
loop: {{max_steps: 6, max_epochs: null, log_every: 3, eval_every: 6}}
checkpoint: {{every_n_steps: 6, keep_last: 1}}
logging: {{progress: "off"}}
ledger: {{energy: "off"}}
""")
    _fits_under(tmp_path, 96)


def test_parquet_shards_keep_to_the_same_budget(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    (tmp_path / "p").mkdir()
    for i in range(100):
        pq.write_table(pa.table({"a": [float(i)], "b": [1.0], "label": [i % 3]}), tmp_path / "p" / f"p-{i:04d}.parquet")
    src = load_shards(str(tmp_path / "p"), Config.model_validate({"data": {"name": "shards:x"}}).data)
    src._files.limit = 8
    before = _fds()
    x, _ = src.take(torch.arange(100))
    assert x[:, 0].tolist() == list(range(100)) and len(src._files) == 8
    assert before is None or _fds() <= before + 8


def _fits_under(tmp_path, limit: int) -> None:
    """`ecotrain fit tmp_path/r.yaml` under `ulimit -n LIMIT` finishes."""
    r = subprocess.run([sys.executable, "-m", "ecotrain", "fit", str(tmp_path / "r.yaml"), "--run-dir",
                        str(tmp_path / "run"), "--quiet"], cwd=ROOT, preexec_fn=_low(limit), capture_output=True,
                       text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "run" / "summary.json").is_file()


def _fds():
    return len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None


def test_thousands_of_token_files_train_under_a_low_ulimit(tmp_path):
    """1,500 .bin token files as one stream under `ulimit -n 96`: every file's ids checked at start-up and
    windows read across them (a map holds a descriptor: they are kept to the budget, data/tokens.py)."""
    import numpy as np

    (tmp_path / "t").mkdir()
    for i in range(1_500):
        (tmp_path / "t" / f"t-{i:05d}.bin").write_bytes((np.arange(40) % 50).astype("uint16").tobytes())
    (tmp_path / "r.yaml").write_text(f"""\
name: many-tokens
data: {{name: "shards:{tmp_path / 't'}/t-*.bin", kwargs: {{seq_len: 16, dtype: uint16, vocab_size: 50}},
        batch_size: 64, val_split: 0.05, test_split: 0.0}}
model: {{name: charlm, kwargs: {{d_model: 16, n_layers: 1, n_heads: 2}}}}
loop: {{max_steps: 4, max_epochs: null, log_every: 2, eval_every: 4}}
logging: {{progress: "off"}}
ledger: {{energy: "off"}}
""")
    _fits_under(tmp_path, 96)


def test_a_token_file_map_is_dropped_beyond_the_budget(tmp_path):
    import numpy as np

    from ecotrain.data import tokens

    files = []
    for i in range(12):
        p = tmp_path / f"f{i}.bin"
        p.write_bytes(np.full(10, i, dtype="uint16").tobytes())
        files.append(tokens.TokenFile(p, "uint16"))
    old = tokens._MAPS.limit
    tokens._MAPS.limit = 4
    try:
        before = _fds()
        assert [int(f.arr[3]) for f in files] == list(range(12))
        assert len(tokens._MAPS) == 4
        assert before is None or _fds() <= before + 4
    finally:
        tokens._MAPS.limit = old
        tokens._MAPS.close()
