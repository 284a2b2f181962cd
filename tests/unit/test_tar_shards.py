"""`data.name: shards:PATTERN` over WebDataset-style tar shards: the pattern, the index, the
decoding, and every kind of damage (one line naming the file and the byte, or left out and counted)."""

import io
import tarfile

import numpy as np
import pytest
import torch

from ecotrain.config import Config
from ecotrain.data.builtin import load_data
from ecotrain.data.shards import expand, load_shards
from ecotrain.base.errors import DataError
from tests.helpers.tars import make_tar_shards

pytestmark = pytest.mark.unit


def cfg(pattern, **data):
    return Config.model_validate({"data": {"name": f"shards:{pattern}", **data}}).data


@pytest.fixture
def tars(tmp_path):
    return make_tar_shards(tmp_path / "d", shards=6, per_shard=10, dim=8)


def test_patterns_folder_glob_braces_and_lists_name_the_same_shards(tars, tmp_path):
    d = tmp_path / "d"
    assert expand(str(d)) == tars
    assert expand(f"{d}/train-*.tar") == tars
    assert expand(f"{d}/train-{{000000..000005}}.tar") == tars
    assert expand(f"{tars[2]},{tars[0]}") == [tars[2], tars[0]]  # a list keeps its order
    assert expand(f"{d}/train-00000{{1,3}}.tar") == [tars[1], tars[3]]
    with pytest.raises(DataError, match="no such shard file"):
        expand(f"{d}/train-{{000000..000009}}.tar")
    with pytest.raises(DataError, match="named twice"):
        expand(f"{tars[0]},{d}/*.tar")


def test_every_sample_is_indexed_and_read_by_position(tars):
    src = load_shards(str(tars[0].parent), cfg("x"))
    assert len(src) == 60 and src.shard_sizes(torch.arange(60)) == [10] * 6
    x, y = src.take(torch.tensor([59, 0, 31]))
    assert x[:, 0].tolist() == [59.0, 0.0, 31.0] and x.dtype == torch.float32 and x.shape == (3, 8)
    assert y.tolist() == src.labels()[[59, 0, 31]].tolist()


def test_webdatasets_own_writer_is_read(tmp_path):
    wds = pytest.importorskip("webdataset")  # in the test extra: never skipped under make test
    with wds.TarWriter(str(tmp_path / "w.tar")) as sink:
        for i in range(5):
            sink.write({"__key__": f"s{i:03d}", "npy": np.full(3, i, np.float32), "cls": i % 2})
    src = load_shards(str(tmp_path / "w.tar"), cfg("x"))
    x, y = src.take(torch.arange(5))
    assert x[:, 0].tolist() == [0, 1, 2, 3, 4] and y.tolist() == [0, 1, 0, 1, 0]


def test_the_splits_and_a_worked_run_see_the_shards(tars):
    c = Config.model_validate({"data": {"name": f"shards:{tars[0].parent}", "val_split": 0.2, "test_split": 0.0}})
    b = load_data(c)
    assert len(b.train) + len(b.val) == 60 and b.input_shape == (8,)
    assert sum(b.extra["blocks"]) == len(b.train) and "data_skipped" not in b.extra


def _truncate(path, keep):
    data = path.read_bytes()
    path.write_bytes(data[:keep])


def test_a_truncated_shard_is_one_line_with_its_byte_or_its_complete_samples_kept(tars):
    _truncate(tars[3], 512 * 9 + 100)  # inside sample 2's .npy payload (2 members of 2 blocks each per sample)
    with pytest.raises(DataError) as e:
        load_shards(str(tars[0].parent), cfg("x"))
    msg = str(e.value)
    assert str(tars[3]) in msg and "truncated" in msg and "at byte 4096" in msg and "on_bad_shard=skip" in msg
    src = load_shards(str(tars[0].parent), cfg("x", on_bad_shard="skip"))
    assert len(src) == 52 and src.damage.samples == 1 and tars[3].name in src.damage.shards
    assert src.shard_sizes(torch.arange(len(src)))[3] == 2  # the two complete samples before the cut


def test_a_corrupt_header_is_named_by_its_byte(tars):
    data = bytearray(tars[1].read_bytes())
    data[512 * 8: 512 * 8 + 20] = b"\xff" * 20  # the header of sample 2's first member
    tars[1].write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"corrupt tar header at byte 4096"):
        load_shards(str(tars[0].parent), cfg("x"))
    src = load_shards(str(tars[0].parent), cfg("x", on_bad_shard="skip"))
    assert len(src) == 52 and src.damage.to_json()["shards"] == {tars[1].name: "corrupt tar header at byte 4096"}


def test_not_a_tar_and_an_empty_shard(tars, tmp_path):
    tars[0].write_bytes(b"hello" * 300)
    with pytest.raises(DataError, match="not a readable tar shard"):
        load_shards(str(tars[0].parent), cfg("x"))
    with tarfile.open(tars[1], "w"):
        pass
    src = load_shards(str(tars[0].parent), cfg("x", on_bad_shard="skip"))
    assert len(src) == 40 and set(src.damage.shards) == {tars[0].name, tars[1].name}


def test_a_damaged_payload_fails_naming_the_sample_or_is_left_out_of_its_batch(tars):
    data = bytearray(tars[2].read_bytes())
    data[512 * 5: 512 * 5 + 6] = b"garbag"  # sample 21's .npy payload: not numpy's magic any more
    tars[2].write_bytes(bytes(data))
    src = load_shards(str(tars[0].parent), cfg("x"))  # start-up reads labels only: the damage is found on read
    with pytest.raises(DataError) as e:
        src.take(torch.tensor([20, 21]))
    assert str(tars[2]) in str(e.value) and "sample '000021' at byte 2560" in str(e.value)
    skip = load_shards(str(tars[0].parent), cfg("x", on_bad_shard="skip"))
    x, y = skip.take(torch.tensor([20, 21, 22]))
    assert x[:, 0].tolist() == [20.0, 22.0] and skip.last_dropped == [21]
    assert y.tolist() == skip.labels()[[20, 22]].tolist()


def test_a_missing_member_and_bad_labels(tmp_path):
    path = tmp_path / "m.tar"
    with tarfile.open(path, "w") as tar:
        for name, data in (("a.npy", _npy([1.0])), ("a.cls", b"1"), ("b.npy", _npy([2.0])),
                           ("c.npy", _npy([3.0])), ("c.cls", b"0")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(DataError, match=r"sample 'b': no \.cls member"):
        load_shards(str(path), cfg("x"))
    src = load_shards(str(path), cfg("x", on_bad_shard="skip"))
    assert len(src) == 2 and src.damage.samples == 1
    with pytest.raises(DataError, match=r"no label member '\.y'"):
        load_shards(str(path), cfg("x", target="y"))


def test_mixed_kinds_are_refused(tars, tmp_path):
    (tmp_path / "d" / "x.parquet").write_bytes(b"")
    with pytest.raises(DataError, match="one kind per run"):
        load_shards(str(tmp_path / "d"), cfg("x"))


def _npy(values):
    buf = io.BytesIO()
    np.save(buf, np.asarray(values, np.float32))
    return buf.getvalue()


def test_a_shard_cut_in_a_members_padding_is_truncated_at_its_last_byte(tars):
    _truncate(tars[4], 512 * 9 + 300)  # sample 2's .npy payload is whole, its padding and .cls are not
    with pytest.raises(DataError, match=r"train-000004.tar: truncated at byte 4908"):
        load_shards(str(tars[0].parent), cfg("x"))
    src = load_shards(str(tars[0].parent), cfg("x", on_bad_shard="skip"))
    assert len(src) == 52 and src.damage.samples == 1  # sample 2 lost its .cls member
