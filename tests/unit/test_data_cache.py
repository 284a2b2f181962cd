"""The dataset cache (data/cache.py): bit-identical data, content-addressed keys, corrupt entries
regenerated, atomic writes, and mnist1d imported only on a miss."""

from __future__ import annotations

import logging
import os
import random
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from ecotrain.data import cache
from ecotrain.data.builtin import mnist1d as _mnist1d
from tests.helpers.deadline import deadline

VERSIONS = {"fake": "1.0"}


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ECOTRAIN_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def fake_data():
    return {"x": np.arange(12, dtype=np.float64).reshape(3, 4) / 7, "y": np.array([2, 0, 1]),
            "meta": {"t": np.linspace(0, 1, 5, dtype=np.float32), "flags": np.array([True, False])}}


class Maker:
    def __init__(self):
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return fake_data()


def assert_identical(a, b, where=""):
    """Same keys, and every array the same dtype, shape and bytes."""
    assert isinstance(a, dict) and isinstance(b, dict) and set(a) == set(b), where
    for k in a:
        if isinstance(a[k], dict):
            assert_identical(a[k], b[k], f"{where}/{k}")
        else:
            assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, f"{where}/{k}"
            assert a[k].tobytes() == b[k].tobytes(), f"{where}/{k}"


def entries(root):
    return sorted((root / "datasets").iterdir()) if (root / "datasets").is_dir() else []


def test_cache_folder(monkeypatch, tmp_path):
    assert cache.cache_dir() == tmp_path / "cache"
    monkeypatch.delenv("ECOTRAIN_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "xdg" / "ecotrain"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.cache_dir() == tmp_path / "home" / ".cache" / "ecotrain"


def test_miss_then_hit_round_trips_bit_for_bit(own_cache):
    make = Maker()
    first = cache.load_or_make("fake", VERSIONS, {"n": 3}, make)
    second = cache.load_or_make("fake", VERSIONS, {"n": 3}, make)
    assert make.calls == 1
    assert_identical(first, fake_data())
    assert_identical(second, fake_data())
    assert all(a.flags.writeable and a.flags.c_contiguous for a in (second["x"], second["meta"]["t"]))
    [entry] = entries(own_cache)
    assert entry.suffix == ".safetensors" and entry.name.startswith("fake-")
    assert entry.read_bytes()[8:9] == b"{"  # a safetensors JSON header, not a pickle


def test_key_is_generator_args_versions_and_format(own_cache, monkeypatch):
    make = Maker()
    cache.load_or_make("fake", VERSIONS, {"n": 3}, make)
    cache.load_or_make("fake", VERSIONS, {"n": 4}, make)  # other arguments
    cache.load_or_make("fake", {"fake": "1.1"}, {"n": 3}, make)  # another version of the generator
    cache.load_or_make("other", VERSIONS, {"n": 3}, make)  # another generator
    monkeypatch.setattr(cache, "FORMAT", cache.FORMAT + 1)
    cache.load_or_make("fake", VERSIONS, {"n": 3}, make)  # another cache format
    assert make.calls == 5 and len(entries(own_cache)) == 5
    key, spec = cache.entry_key("fake", VERSIONS, {"b": 1, "a": [1, 2]})
    assert key == cache.entry_key("fake", dict(reversed(VERSIONS.items())), {"a": [1, 2], "b": 1})[0]
    assert '"generator":"fake"' in spec and '"fake":"1.0"' in spec


@pytest.mark.parametrize("damage", ["flip_data", "flip_header", "truncate", "garbage", "empty", "other_entry"])
def test_corrupt_entry_is_detected_and_regenerated(own_cache, caplog, damage):
    make = Maker()
    cache.load_or_make("fake", VERSIONS, {"n": 3}, make)
    [entry] = entries(own_cache)
    blob = bytearray(entry.read_bytes())
    if damage == "flip_data":
        blob[-3] ^= 0x01  # one bit of the last array
    elif damage == "flip_header":
        blob[10] ^= 0x20
    elif damage == "truncate":
        del blob[len(blob) // 2:]
    elif damage == "garbage":
        blob = bytearray(os.urandom(len(blob)))
    elif damage == "empty":
        blob = bytearray()
    else:  # a whole, valid entry, but for other arguments (a file copied over this one)
        cache.load_or_make("fake", VERSIONS, {"n": 99}, make)
        make.calls -= 1
        other = next(p for p in entries(own_cache) if p != entry)
        blob = bytearray(other.read_bytes())
    entry.write_bytes(bytes(blob))
    with caplog.at_level(logging.WARNING, logger="ecotrain"):
        data = cache.load_or_make("fake", VERSIONS, {"n": 3}, make)
    assert make.calls == 2, "a damaged entry must never be used"
    assert_identical(data, fake_data())
    assert "regenerating" in caplog.text and entry.name in caplog.text
    again = cache.load_or_make("fake", VERSIONS, {"n": 3}, make)  # the entry was rewritten, whole
    assert make.calls == 2
    assert_identical(again, fake_data())


def test_a_fifo_entry_is_regenerated_never_waited_on(own_cache, caplog):
    make = Maker()
    cache.load_or_make("fake", VERSIONS, {"n": 3}, make)
    [entry] = entries(own_cache)
    entry.unlink()
    os.mkfifo(entry)  # no writer: a plain read_bytes() would block the run forever
    with deadline(20, "the dataset cache"), caplog.at_level(logging.WARNING, logger="ecotrain"):
        data = cache.load_or_make("fake", VERSIONS, {"n": 3}, make)
    assert make.calls == 2 and entry.is_file()  # made again, and the FIFO written over
    assert_identical(data, fake_data())
    assert "the dataset cache entry is a FIFO (named pipe), not a regular file; regenerating it" in caplog.text


def test_failed_write_leaves_no_partial_file(own_cache, monkeypatch, caplog):
    def boom(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cache.os, "replace", boom)
    make = Maker()
    with caplog.at_level(logging.WARNING, logger="ecotrain"):
        data = cache.load_or_make("fake", VERSIONS, {"n": 3}, make)
    assert_identical(data, fake_data())  # the run goes on with the generated data
    assert "cannot write" in caplog.text and "ECOTRAIN_CACHE" in caplog.text
    assert entries(own_cache) == []  # no entry, and no temporary file left behind


def test_unwritable_cache_folder_still_returns_the_data(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("ECOTRAIN_CACHE", str(blocker))
    with caplog.at_level(logging.WARNING, logger="ecotrain"):
        data = cache.load_or_make("fake", VERSIONS, {"n": 3}, Maker())
    assert_identical(data, fake_data())
    assert "cannot write" in caplog.text


def test_only_numeric_arrays_are_cached():
    with pytest.raises(TypeError, match="numeric NumPy arrays"):
        cache.load_or_make("fake", VERSIONS, {}, lambda: {"x": [1, 2, 3]})
    with pytest.raises(TypeError, match="numeric NumPy arrays"):
        cache.load_or_make("fake", VERSIONS, {}, lambda: {"x": np.array(["a"], dtype=object)})


def mnist_cfg(num_samples=500, **kwargs):
    return SimpleNamespace(data=SimpleNamespace(num_samples=num_samples, kwargs=kwargs))


def test_mnist1d_from_the_cache_is_make_datasets_output(own_cache):
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples, args.seed = 500, 3
    reference = make_dataset(args)
    versions = {"mnist1d": cache.package_version("mnist1d"), "numpy": np.__version__,
                "scipy": cache.package_version("scipy")}
    np.random.seed(1234)
    random.seed(1234)
    miss = _mnist1d(mnist_cfg(seed=3))
    assert np.random.rand() == np.random.RandomState(1234).rand(), "generation must leave NumPy's generator alone"
    assert random.random() == random.Random(1234).random(), "and Python's"
    [entry] = entries(own_cache)
    key, _ = cache.entry_key("mnist1d", versions, {"num_samples": 500, "kwargs": {"seed": 3}})
    assert entry == cache.entry_path("mnist1d", key)
    stored = cache.load_or_make("mnist1d", versions, {"num_samples": 500, "kwargs": {"seed": 3}},
                                lambda: pytest.fail("a warm cache must not regenerate"))
    assert_identical(stored, reference)  # every array of make_dataset's output, templates included
    hit = _mnist1d(mnist_cfg(seed=3))
    for (xa, ya), (xb, yb) in zip(miss[:2], hit[:2]):
        assert xa.dtype == xb.dtype and torch.equal(xa, xb) and torch.equal(ya, yb)
    assert torch.equal(miss[0][0], torch.as_tensor(reference["x"].astype(np.float32)))


def test_mnist1d_bad_kwarg_is_a_data_error():
    from ecotrain.base.errors import DataError

    with pytest.raises(DataError, match="data.kwargs.nope"):
        _mnist1d(mnist_cfg(nope=1))


def test_a_cache_hit_does_not_import_mnist1d(own_cache):
    _mnist1d(mnist_cfg())  # warm (in this process)
    code = ("import sys; from types import SimpleNamespace as N; from ecotrain.data.builtin import mnist1d as _mnist1d; "
            "tr, te, k = _mnist1d(N(data=N(num_samples=500, kwargs={}))); "
            "assert 'mnist1d' not in sys.modules, 'imported on a hit'; print(len(tr[0]), len(te[0]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "ECOTRAIN_CACHE": str(own_cache)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["400", "100"]
