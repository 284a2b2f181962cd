"""Tar shard headers (data/tarheaders.py): every header is checked before the reader moves on, so a
negative size, a huge one, a bad checksum or a hostile member name is one line naming the shard and
the member, never a hang; what tarfile, GNU tar and webdataset write reads as tarfile reads it."""

import io
import random
import shutil
import subprocess
import tarfile

import numpy as np
import pytest

from ecotrain.config import Config
from ecotrain.data.shards import load_shards
from ecotrain.data.tarheaders import TarDamage, members
from ecotrain.base.errors import DataError
from tests.helpers.tars import make_tar_shards, member, npy_bytes, raw_tar

pytestmark = pytest.mark.unit

X = npy_bytes([1.0, 2.0])
SAMPLE = (member("000000.npy", X), member("000000.cls", b"1"))


def cfg(**data):
    return Config.model_validate({"data": {"name": "shards:x", **data}}).data


def octal_size(name: str, text: bytes) -> bytes:
    """A member whose size field is octal text (`-1000`: negative), its checksum made to hold."""
    b = bytearray(member(name, X))
    b[124:136], b[148:156] = text.ljust(12, b"\0"), b" " * 8
    b[148:156] = f"{sum(b[:512]):06o}\0 ".encode()
    return bytes(b)


def read(data: bytes) -> list:
    f = io.BytesIO(data)
    return list(members(f, len(data)))


@pytest.mark.parametrize("bad, words", [
    (member("000001.npy", X, size=-512), ["at byte 2048", "'000001.npy'", "negative size (-512)"]),  # base-256
    (octal_size("000001.npy", b"-1000"), ["at byte 2048", "'000001.npy'", "negative size (-512)"]),
    (octal_size("000001.npy", b"12x4"), ["the size field of member '000001.npy' is not a number"]),
    (member("000001.npy", X)[:148] + b"0000000\0" + member("000001.npy", X)[156:], ["corrupt tar header at byte 2048"]),
    (member("000001.npy", X, size=10 ** 18), ["truncated: member '000001.npy' at byte 2048 needs 10000000000000000"]),
    (member("000001.npy", X, size=4096), ["truncated: member '000001.npy'", "needs 4096 bytes"]),
    (member("/abs/000001.npy", X), ["'/abs/000001.npy' at byte 2048 has an absolute name"]),
    (member("a/../000001.npy", X), ["'a/../000001.npy'", "'..' in its name"]),
    (member(b"0001\0.npy", X), ["at byte 2048", "NUL byte"]),
    (member(b"", X), ["member '' at byte 2048 has an empty name"]),
    (member("././@PaxHeader", b"14 size=-1024\n", kind=b"x") + member("000001.npy", X),
     ["at byte 2048", "'000001.npy'", "negative size (-1024)"]),
    (member("././@PaxHeader", b"15 path=\0x.npy\n", kind=b"x") + member("000001.npy", X), ["NUL byte in its name"]),
    (member("././@PaxHeader", b"99999 path=x\n", kind=b"x"), ["pax record", "does not parse"]),
    (member("././@PaxHeader", b"12 size=1x0\n", kind=b"x") + member("000001.npy", X), ["pax size", "not a number"]),
    (member("././@PaxHeader", b"", size=1 << 40, kind=b"x"), ["needs 1099511627776 bytes"]),
    (member("x", b"", size=2 << 20, kind=b"L") + b"\0" * (2 << 20), ["a 2097152-byte long header"]),
    (member("000001.npy", X, kind=b"S"), ["'000001.npy'", "sparse file"]),
])
def test_a_hostile_header_is_one_line_naming_the_member(bad, words):
    data = raw_tar(*SAMPLE, bad)
    with pytest.raises(TarDamage) as e:
        read(data)
    for w in words:
        assert w in e.value.what, e.value.what


def test_long_names_in_gnu_and_pax_headers_are_read():
    long = "a" * 300 + "/000001.npy"
    data = raw_tar(member("././@LongLink", long.encode() + b"\0", kind=b"L"), member("000001.np", X),
                   member("././@PaxHeader", f"{len(long) + 10} path={long[:-1]}y\n".encode(), kind=b"x"),
                   member("000001.np", X))
    assert [(m[0], m[1]) for m in read(data)] == [(long, 0), (long[:-1] + "y", 2048)]


def test_the_shards_error_names_the_file_and_the_member_and_skip_keeps_the_whole_samples(tmp_path):
    path = tmp_path / "b.tar"
    path.write_bytes(raw_tar(*SAMPLE, member("000001.npy", X, size=-512)))
    with pytest.raises(DataError) as e:
        load_shards(str(path), cfg())
    assert str(e.value) == (f"{path}: corrupt tar header at byte 2048: member '000001.npy' declares a negative "
                            "size (-512); rewrite or remove the shard, or set data.on_bad_shard=skip")
    src = load_shards(str(path), cfg(on_bad_shard="skip"))
    assert len(src) == 1 and "negative size" in src.damage.shards["b.tar"]


def test_two_members_of_one_extension_are_refused_not_overwritten(tmp_path):
    path = tmp_path / "d.tar"
    path.write_bytes(raw_tar(*SAMPLE, member("0001.x.npy", X), member("0001.x.npy", npy_bytes([9.0, 9.0])),
                             member("0001.cls", b"0"), member("0002.x.npy", X), member("0002.cls", b"1")))
    with pytest.raises(DataError) as e:
        load_shards(str(path), cfg(features=["x.npy"]))
    assert str(e.value) == (f"{path}: sample '0001' has two '.x.npy' members (the second at byte 3072); a sample "
                            "holds one member per extension: rewrite the shard, or set data.on_bad_shard=skip")
    path.write_bytes(raw_tar(member("0001.x.npy", X), member("0001.x.npy", X), member("0001.cls", b"0"),
                             member("0002.x.npy", X), member("0002.cls", b"1")))
    src = load_shards(str(path), cfg(on_bad_shard="skip"))  # the sample is left out whole, the next one kept
    assert src.keys == ["0002"] and src.damage.samples == 1


def test_hidden_members_have_no_key_and_are_passed_over(tmp_path):
    path = tmp_path / "h.tar"  # macOS's tar adds ._NAME files (resource forks); webdataset skips them too
    path.write_bytes(raw_tar(member("._000000.npy", b"\0\x05\x16\x07"), *SAMPLE))
    assert load_shards(str(path), cfg()).keys == ["000000"]


def _names(tar_path):
    with tarfile.open(tar_path) as t:
        want = [(m.name, m.offset, m.offset_data, m.size) for m in t if m.isfile()]
    with open(tar_path, "rb") as f:
        got = list(members(f, tar_path.stat().st_size))
    return want, got


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_what_tarfile_writes_reads_as_tarfile_reads_it(tmp_path, fmt):
    path = tmp_path / "t.tar"
    long = "d/" + "x" * 150 + "/000001"  # a long path: ustar's prefix, GNU's long name, a pax record
    names = ["000000.npy", "000000.cls", f"{long}.npy", f"{long}.cls", "ü/000002.npy", "ü/000002.cls"]
    with tarfile.open(path, "w", format=fmt) as t:
        folder = tarfile.TarInfo("d")
        folder.type = tarfile.DIRTYPE
        t.addfile(folder)
        for name in names:
            info = tarfile.TarInfo(name)
            info.size = len(X)
            t.addfile(info, io.BytesIO(X))
    want, got = _names(path)
    assert got == want and [g[0] for g in got] == names


@pytest.mark.skipif(shutil.which("tar") is None, reason="no tar program")
@pytest.mark.parametrize("fmt", ["gnu", "posix"])
def test_what_gnu_tar_writes_reads_as_tarfile_reads_it(tmp_path, fmt):
    src = tmp_path / "src" / ("y" * 120)
    src.mkdir(parents=True)
    (src / "000003.npy").write_bytes(X)
    (src / "000003.cls").write_bytes(b"2")
    (tmp_path / "src" / "link").symlink_to(src / "000003.npy")
    subprocess.run(["tar", f"--format={fmt}", "-cf", str(tmp_path / "t.tar"), "-C", str(tmp_path), "src"], check=True)
    want, got = _names(tmp_path / "t.tar")
    assert got == want and len(got) == 2


def test_webdatasets_writer_reads_as_tarfile_reads_it(tmp_path):
    wds = pytest.importorskip("webdataset")
    with wds.TarWriter(str(tmp_path / "w.tar")) as sink:
        for i in range(3):
            sink.write({"__key__": f"s{i:03d}", "npy": np.full(3, i, np.float32), "cls": i})
    want, got = _names(tmp_path / "w.tar")
    assert got == want and len(got) == 6


class Bounded(io.BytesIO):
    """A file that fails a reader reading more often than its blocks allow: one that went backwards."""

    def read(self, n=-1):
        self.reads = getattr(self, "reads", 0) + 1
        if self.reads > 2 * (len(self.getbuffer()) // 512 + 1):  # a header, and a pax or long-name one's data
            raise AssertionError("more reads than blocks: the reader went backwards")
        return super().read(n)


def test_no_damaged_shard_hangs_or_escapes_as_another_error(tmp_path):
    """Random byte flips and cuts of a real shard: each ends, in a list of members or in one TarDamage,
    and every header read moves forward (at most two reads a block)."""
    good = make_tar_shards(tmp_path, shards=1, per_shard=6, dim=4)[0].read_bytes()
    rng = random.Random(0)
    for _ in range(400):
        data = bytearray(good)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        if rng.random() < 0.3:
            data = data[:rng.randrange(len(data))]
        try:
            list(members(Bounded(bytes(data)), len(data)))
        except TarDamage:
            pass
