"""Small WebDataset-style tar shards for tests and benches: sample `{id:06d}` is `.npy` (float32
features whose first value is the sample's id, so a model or a test can tell which samples it saw)
and `.cls` (its label), written with the standard library's tarfile as webdataset's TarWriter does."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime = len(data), 0
    tar.addfile(info, io.BytesIO(data))


def make_tar_shards(folder: Path, shards: int = 20, per_shard: int = 10, dim: int = 8, classes: int = 4,
                    seed: int = 0) -> list[Path]:
    """`shards` files `train-000000.tar`...: ids 0..shards*per_shard-1; labels learnable from the features."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for s in range(shards):
        path = folder / f"train-{s:06d}.tar"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(s * per_shard, (s + 1) * per_shard):
                label = int(rng.integers(classes))
                x = rng.normal(size=dim).astype(np.float32)
                x[1 + label % (dim - 1)] += 3.0  # the class is visible in one feature
                x[0] = i  # the sample's id
                buf = io.BytesIO()
                np.save(buf, x, allow_pickle=False)
                _add(tar, f"{i:06d}.npy", buf.getvalue())
                _add(tar, f"{i:06d}.cls", str(label).encode())
        paths.append(path)
    return paths


def header(name: bytes, size: int, kind: bytes = b"0") -> bytes:
    """One ustar header with any name and any declared size (negative or huge: GNU's base-256 field
    when octal cannot hold it), and a checksum that holds: what a hostile or broken writer makes."""
    b = bytearray(512)
    b[:100] = name[:100].ljust(100, b"\0")
    b[100:124] = b"0000644\x000000000\x000000000\x00"  # mode, uid, gid
    b[124:136] = (f"{size:011o}\0".encode() if 0 <= size < 8 ** 11
                  else bytes([0xFF if size < 0 else 0x80]) + (size % (1 << 88)).to_bytes(11, "big"))
    b[136:148] = b"00000000000\0"  # mtime
    b[156:157] = kind
    b[257:265] = b"ustar\x0000"
    b[148:156] = b" " * 8
    b[148:156] = f"{sum(b):06o}\0 ".encode()
    return bytes(b)


def member(name: bytes | str, data: bytes, size: int | None = None, kind: bytes = b"0") -> bytes:
    """A header and its data padded to whole blocks; `size` declares another size than the data's."""
    name = name.encode() if isinstance(name, str) else name
    return header(name, len(data) if size is None else size, kind) + data + b"\0" * (-len(data) % 512)


def npy_bytes(values) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.asarray(values, np.float32), allow_pickle=False)
    return buf.getvalue()


def raw_tar(*members: bytes) -> bytes:
    """Members (from `member`) and the two zero blocks that end an archive."""
    return b"".join(members) + b"\0" * 1024
