"""Files export/ reads for `predict` go through base/safefile: a --prompts FILE or a --data .npz that is a
FIFO (no writer: a plain open blocks forever, past SIGTERM) or too big is one line, at once."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import numpy as np
import pytest

from ecotrain.base.errors import DataError
from ecotrain.export import generate
from ecotrain.export.generate import read_prompts
from ecotrain.export.inference import _labelled
from tests.helpers.deadline import deadline


def test_a_prompts_fifo_is_one_line_without_waiting(tmp_path):
    fifo = tmp_path / "prompts.txt"
    os.mkfifo(fifo)
    with deadline(20, "--prompts FIFO"), pytest.raises(DataError) as err:
        read_prompts(None, str(fifo))
    assert "\n" not in str(err.value)
    assert str(err.value).endswith("is a FIFO (named pipe), not a regular file; give a UTF-8 text file, one prompt "
                                   "per line")


def test_a_prompts_file_above_the_cap_is_refused_before_it_is_read(tmp_path, monkeypatch):
    path = tmp_path / "prompts.txt"
    path.write_text("def main(\nclass A:\n")
    assert [p for _, p in read_prompts(None, str(path))] == ["def main(", "class A:"]
    monkeypatch.setattr(generate, "PROMPTS_MAX_BYTES", 8)
    with pytest.raises(DataError, match=r"prompts\.txt: the prompts file is 19 bytes, more than the 8 bytes one may be"):
        read_prompts(None, str(path))


def test_whether_an_npz_holds_labels_never_waits_on_a_fifo(tmp_path):
    good = tmp_path / "d.npz"
    np.savez(good, x=np.zeros((2, 3)))
    assert _labelled(SimpleNamespace(data=SimpleNamespace(name="npz", path=str(good)))) is False
    fifo = tmp_path / "f.npz"
    os.mkfifo(fifo)
    start = time.monotonic()
    with deadline(6, "--data FIFO"):  # the old np.load(path) blocked until this alarm, then said "labelled"
        assert _labelled(SimpleNamespace(data=SimpleNamespace(name="npz", path=str(fifo)))) is True
    assert time.monotonic() - start < 5  # the loader says why in one line, later


def test_a_pt2_path_is_read_through_safefile(tmp_path, monkeypatch):
    from ecotrain.base.errors import CheckpointError
    from ecotrain.export import program

    fifo = tmp_path / "m.pt2"
    os.mkfifo(fifo)
    with deadline(20, ".pt2 FIFO"), pytest.raises(CheckpointError) as err:
        program.load_pt2(fifo)
    assert str(err.value) == (f"{fifo}: the .pt2 archive is a FIFO (named pipe), not a regular file; give the .pt2 "
                              "file that `ecotrain export` wrote")
    big = tmp_path / "big.pt2"
    big.write_bytes(b"PK" + b"\x00" * 30)
    monkeypatch.setattr(program, "PT2_MAX_BYTES", 16)
    with pytest.raises(CheckpointError, match=r"big\.pt2: the \.pt2 archive is 32 bytes, more than the 16 bytes"):
        program.load_pt2(big)
    monkeypatch.setattr(program, "PT2_MAX_BYTES", 1 << 20)
    with pytest.raises(CheckpointError, match=r"big\.pt2: not a readable torch.export archive"):  # named by its path, as before
        program.load_pt2(big)


def test_a_big_cap_costs_a_small_file_nothing(tmp_path):
    """read_bytes allocates what the file holds, not its cap: a 64 GiB cap on a 10-byte file."""
    import tracemalloc

    from ecotrain.base import safefile

    path = tmp_path / "small.bin"
    path.write_bytes(b"0123456789")
    tracemalloc.start()
    try:
        assert safefile.read_bytes(path, "file", 64 << 30) == b"0123456789"
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    assert safefile.read_bytes("/proc/self/status", "status", 1 << 20).startswith(b"Name:")  # says size 0
    with pytest.raises(Exception, match="more than the 16 bytes"):
        safefile.read_bytes("/proc/self/status", "status", 16)
