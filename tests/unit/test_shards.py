"""parquet:FOLDER (data/shards.py) and WindowSampler: streamed order, reads, bad shards, content hash."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from ecotrain.config import build_config
from ecotrain.data import load_data
from ecotrain.data.sampler import WindowSampler
from ecotrain.base.errors import DataError


def write_shards(folder, shards=3, rows=120, width=6, seed=0, group=40):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for s in range(shards):
        x = rng.normal(size=(rows, width)).astype(np.float32)
        y = (x[:, 0] > 0).astype(np.int64) + 2 * (x[:, 1] > 0)
        t = pa.table({"x": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), width), "label": y})
        pq.write_table(t, folder / f"part-{s:03d}.parquet", row_group_size=group)
        xs.append(x)
        ys.append(y)
    return np.concatenate(xs), np.concatenate(ys)


def _load(folder, **data):
    return load_data(build_config({"data": {"name": f"parquet:{folder}", "shuffle_window": 64, **data}}))


def test_window_sampler_is_a_seeded_permutation_that_resumes_at_any_batch():
    s = WindowSampler([50, 0, 37, 80], batch_size=16, seed=4, window=40)
    order = s.order(3)
    assert sorted(order.tolist()) == list(range(167))
    for start in (0, 1, 5, len(s) - 1):
        assert torch.equal(torch.cat(list(s.batches(3, start))), order[start * 16:])
    assert not torch.equal(order, s.order(4))  # a new order each epoch
    # locality: a window's rows come from at most the blocks it straddles, never from all over
    first = order[:40]
    assert len({int(torch.searchsorted(torch.tensor([50, 50, 87, 167]), r, right=True)) for r in first}) <= 2


def test_rows_match_the_shards_and_the_train_blocks_cover_train(tmp_path):
    x, y = write_shards(tmp_path / "d")
    b = _load(tmp_path / "d", val_split=0.1, test_split=0.2)
    assert b.input_shape == (6,) and b.num_classes == 4
    assert sum(b.extra["blocks"]) == len(b.train) and len(b.extra["blocks"]) == 3
    base_rows = b.train.base.indices[b.train.indices]  # the train split's rows in the shards
    pick = torch.tensor([0, 5, len(b.train) - 1, 17])
    bx, by = b.train.take(pick)
    assert np.array_equal(bx.numpy(), x[base_rows[pick].numpy()])
    assert np.array_equal(by.numpy(), y[base_rows[pick].numpy()])


def test_hash_changes_with_a_shard_and_reads_metadata_only(tmp_path, monkeypatch):
    write_shards(tmp_path / "d")
    h1 = _load(tmp_path / "d").content_hash
    assert _load(tmp_path / "d").content_hash == h1
    write_shards(tmp_path / "d", seed=1)  # same names and sizes, other values: the footers' statistics differ
    assert _load(tmp_path / "d").content_hash != h1
    from ecotrain.data import columns

    read = []
    real_open = open

    def counting_open(path, mode="r", *a, **k):
        f = real_open(path, mode, *a, **k)
        real_read = f.read
        f_read = lambda n=-1: (lambda data: (read.append(len(data)), data)[1])(real_read(n))  # noqa: E731
        return _Wrap(f, f_read)

    monkeypatch.setattr(columns, "open", counting_open, raising=False)
    big = tmp_path / "big"
    write_shards(big, shards=1, rows=20000, width=8, group=5000)
    _load(big)
    assert (big / "part-000.parquet").stat().st_size > 300_000
    assert sum(read) <= 2 * columns.SAMPLE_BYTES  # the fingerprint read head and tail, not the file


class _Wrap:
    def __init__(self, f, read):
        self.f, self.read = f, read

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()

    def seek(self, *a):
        return self.f.seek(*a)


@pytest.mark.parametrize("case, expect", [
    ("missing_column", r"no feature column 'pixels'"),
    ("missing_label", r"no label column 'label'"),
    ("truncated", r"part-001.parquet: not a readable Parquet shard"),
    ("garbage", r"part-002.parquet: not a readable Parquet shard"),
    ("empty", r"part-001.parquet: an empty shard \(0 rows\)"),
    ("schema", r"part-002.parquet: schema differs from part-000.parquet: column 'x' is fixed_size_list.*double"),
    ("ragged", r"lists of different lengths"),
    ("no_shards", r"no .parquet shards"),
])
def test_bad_shards_fail_in_one_line(tmp_path, case, expect):
    d = tmp_path / "d"
    write_shards(d)
    over = {}
    p1, p2 = d / "part-001.parquet", d / "part-002.parquet"
    if case == "missing_column":
        over = {"features": ["pixels"]}
    elif case == "missing_label":
        over = {"target": "label"}
        pq.write_table(pa.table({"x": [[1.0] * 6] * 3}), d / "part-000.parquet")
    elif case == "truncated":
        p1.write_bytes(p1.read_bytes()[: p1.stat().st_size // 2])
    elif case == "garbage":
        p2.write_bytes(b"not parquet at all" * 10)
    elif case == "empty":
        pq.write_table(pq.read_table(p1).slice(0, 0), p1)
    elif case == "schema":
        x = np.zeros((5, 6))
        pq.write_table(pa.table({"x": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 6),
                                 "label": np.zeros(5, np.int64)}), p2)
    elif case == "ragged":
        for p in d.iterdir():
            p.unlink()
        pq.write_table(pa.table({"x": [[1.0, 2.0], [1.0]] * 10, "label": [0, 1] * 10}), d / "part-000.parquet")
    elif case == "no_shards":
        for p in d.iterdir():
            p.unlink()
    with pytest.raises(DataError, match=expect) as e:
        _load(d, **over)
    assert "\n" not in str(e.value)


def test_ddp_ranks_read_disjoint_slices_of_the_streamed_order():
    from ecotrain.core.distributed import ShardedSampler

    base = WindowSampler([60, 45, 30], batch_size=12, seed=1, window=24)
    ranks = [list(ShardedSampler(base, r, 2).batches(2, 3)) for r in range(2)]
    full = [b for b in base.batches(2, 3) if len(b) == 12]
    assert len(ranks[0]) == len(ranks[1]) == len(full)
    for a, b, whole in zip(*ranks, full):
        assert set(a.tolist()).isdisjoint(b.tolist()) and torch.equal(torch.cat([a, b]), whole)
