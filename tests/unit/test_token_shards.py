"""`shards:` of .bin token files read as one stream (data/tokens.py `load_token_shards`), llm.c's
headed shards, and bytes per token from tokens.json or data.kwargs."""

import json

import numpy as np
import pytest
import torch

from ecotrain import Config
from ecotrain.data import load_data
from ecotrain.data.tokens import HEADER_INTS
from ecotrain.base.errors import DataError


def _cfg(name, val_split=0.0, **kwargs):
    return Config.model_validate({"data": {"name": name, "kwargs": kwargs, "batch_size": 4, "val_split": val_split,
                                           "test_split": 0.0}})


def _bin(path, ids, dtype="uint16", header=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        if header is not None:  # llm.c: 256 int32, [magic, version, token count]
            h = np.zeros(HEADER_INTS, dtype="<i4")
            h[:3] = [header[0], header[1], len(ids) if len(header) < 3 else header[2]]
            f.write(h.tobytes())
        f.write(np.asarray(ids, dtype=dtype).tobytes())
    return path


def test_shards_are_one_stream_and_windows_cross_files(tmp_path):
    ids = np.arange(300) % 50
    for i, part in enumerate(np.split(ids, [70, 200])):
        _bin(tmp_path / f"s-{i:03d}.bin", part)
    b = load_data(_cfg(f"shards:{tmp_path}/s-{{000..002}}.bin", val_split=0.1, seq_len=16, dtype="uint16",
                       vocab_size=50))
    assert b.extra["tokens"] == {"train": 270, "val": 30}
    x, y = b.train.take(torch.arange(len(b.train)))
    want = torch.from_numpy(ids.astype(np.int64))
    for i in range(len(x)):  # window 4 runs from the first file into the second
        assert torch.equal(x[i], want[16 * i:16 * i + 16]) and torch.equal(y[i], want[16 * i + 1:16 * i + 17])
    assert len(b.train) == (270 - 17) // 16 + 1


def test_llmc_headers_give_the_dtype_and_vocabulary_and_are_checked(tmp_path):
    _bin(tmp_path / "a.bin", np.arange(100) + 50_000, header=(20240520, 1))
    _bin(tmp_path / "b.bin", np.arange(100) + 100_000, "uint32", header=(20240801, 7))
    b = load_data(_cfg(f"tokens:{tmp_path}/a.bin", seq_len=8))
    assert b.num_classes == 50257 and int(b.train.take(torch.tensor([1]))[0][0, 0]) == 50_008
    with pytest.raises(DataError, match=r"shards with mismatched dtypes: .*a.bin holds uint16 ids, .*b.bin uint32"):
        load_data(_cfg(f"shards:{tmp_path}/a.bin,{tmp_path}/b.bin", seq_len=8))
    _bin(tmp_path / "cut.bin", np.arange(90), header=(20240520, 1, 100))
    with pytest.raises(DataError, match=r"cut.bin: its llm.c header promises 100 uint16 ids \(1,224 bytes\) but the "
                                        r"file holds 1,204 bytes; the file is truncated"):
        load_data(_cfg(f"tokens:{tmp_path}/cut.bin", seq_len=8))
    with pytest.raises(DataError, match=r"a.bin: its llm.c header says uint16 ids, but data.kwargs.dtype says uint32"):
        load_data(_cfg(f"tokens:{tmp_path}/a.bin", seq_len=8, dtype="uint32"))


def test_sidecars_of_shards_must_agree_and_give_bytes_per_token(tmp_path):
    for d, dtype in (("a", "uint16"), ("b", "uint16")):
        _bin(tmp_path / d / "train.bin", np.arange(200) % 40, dtype)
        (tmp_path / d / "tokens.json").write_text(json.dumps({"dtype": dtype, "vocab_size": 40, "bytes": 600,
                                                              "tokens": {"train": 200}, "files": {"train": "train.bin"}}))
    b = load_data(_cfg(f"shards:{tmp_path}/{{a,b}}/train.bin", seq_len=8))
    assert b.extra["bytes_per_token"] == 3.0 and b.extra["tokens"] == {"train": 400}
    assert load_data(_cfg(f"tokens:{tmp_path}/a", seq_len=8, bytes_per_token=2.5)).extra["bytes_per_token"] == 2.5
    (tmp_path / "b" / "tokens.json").write_text(json.dumps({"dtype": "uint32", "vocab_size": 40}))
    with pytest.raises(DataError, match=r"shards with mismatched dtypes: .*a/tokens.json says uint16, .*b/tokens.json "
                                        r"uint32"):
        load_data(_cfg(f"shards:{tmp_path}/{{a,b}}/train.bin", seq_len=8))


def test_a_pattern_mixing_token_files_and_tar_shards_is_one_line(tmp_path):
    _bin(tmp_path / "s" / "a.bin", np.arange(100) % 7)
    (tmp_path / "s" / "b.tar").write_bytes(b"\0" * 1024)
    with pytest.raises(DataError, match=r"b.tar is not a .bin token file among .bin token files; one kind"):
        load_data(_cfg(f"shards:{tmp_path}/s", seq_len=8, dtype="uint16", vocab_size=7))


def test_a_held_out_split_that_is_a_training_file_is_refused(tmp_path):
    """A sidecar (or data.kwargs.test) naming the train file as the test file: test perplexity would be
    measured on trained tokens; one line instead."""
    _bin(tmp_path / "d" / "train.bin", np.arange(200) % 50)
    _bin(tmp_path / "d" / "val.bin", np.arange(100) % 50)
    (tmp_path / "d" / "tokens.json").write_text(json.dumps({
        "format": "ecotrain-tokens", "version": 1, "dtype": "uint16", "vocab_size": 50,
        "files": {"train": "train.bin", "val": "val.bin", "test": "train.bin"}}))
    with pytest.raises(DataError, match="is both the train file and the test file"):
        load_data(_cfg(f"tokens:{tmp_path / 'd'}", seq_len=8))
    _bin(tmp_path / "s" / "a.bin", np.arange(100) % 50)
    _bin(tmp_path / "s" / "b.bin", np.arange(100) % 50)
    with pytest.raises(DataError, match="is both the train file and the test file"):
        load_data(_cfg(f"shards:{tmp_path / 's'}/*.bin", seq_len=8, dtype="uint16", vocab_size=50,
                       test=str(tmp_path / "s" / "b.bin")))
