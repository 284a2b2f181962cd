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
