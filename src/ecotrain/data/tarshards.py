"""WebDataset-style `.tar` shards (`data.name: shards:PATTERN`), read by position, never re-read.

A shard is a plain tar file; the members whose names share a key (the path up to the first dot of
the file name: `000042.npy` and `000042.cls` are sample `000042`, extensions `npy` and `cls`) are one
sample, written consecutively, as `webdataset.TarWriter` and `tar` write them. At start-up every
shard's headers are scanned and checked (data/tarheaders.py seeks over the payloads) into an index
of (shard, offset, size) per sample, and the small label members are read for the splits and the
class count. A batch is then one `os.pread` per sample, from a bounded few open shards
(data/openfiles.py): any sample is reachable at the same cost, so the sampler's position
(data/sampler.py) is the whole resume state and a resume seeks, it re-reads nothing. The
`webdataset` package and torchdata's nodes read a tar as a stream, which cannot start at a sample.

Decoding: the feature member `npy` (numpy's format, `allow_pickle=False`) or `json` (a list of
numbers); the label member `cls`, `label`, `txt` or `json` holding one integer.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ecotrain.base import safefile
from ecotrain.data.columns import fingerprint
from ecotrain.data.openfiles import OpenFiles
from ecotrain.data.tarheaders import TarDamage, members
from ecotrain.base.errors import DataError
from ecotrain.base.log import log

LABEL_EXTS = ("cls", "label", "txt", "json")
FEATURE_EXTS = ("npy", "json")


@dataclass
class Damage:
    """What `data.on_bad_shard: skip` left out, for summary.json (`data_skipped`)."""

    shards: dict[str, str] = field(default_factory=dict)  # shard file name -> what was wrong, where
    samples: int = 0  # samples left out at start-up (a damaged member, a sample with a member missing)

    def add(self, path: Path, what: str, samples: int = 0) -> None:
        self.shards[path.name] = what
        self.samples += samples
        log.warning(f"data.on_bad_shard=skip: {path}: {what}; skipped")

    def to_json(self) -> dict:
        return {"shards": dict(self.shards), "samples": self.samples}


def _split_key(name: str) -> tuple[str, str]:
    """WebDataset's rule: the key is the path up to the first dot of the base name; the rest is the
    extension (`a/b/000042.seg.npy` -> (`a/b/000042`, `seg.npy`))."""
    head, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    return (f"{head}/{stem}" if head else stem), (ext if dot else "")


def _scan(path: Path, on_bad: str, damage: Damage) -> list[tuple[str, dict[str, tuple[int, int]]]]:
    """[(key, {ext: (payload offset, size)})] of one shard, in file order. Damage (a truncated or
    corrupt header, a bad member name, a sample with two members of one extension) is one line
    naming the file and the member (fail), or the complete samples are kept and counted (skip)."""
    size = path.stat().st_size
    samples: list[tuple[str, dict]] = []
    bad, lost, dropped = None, 0, None  # what stopped the scan, the samples it cost; a refused sample's key
    try:
        with safefile.open_regular(path, "tar shard", error=DataError) as f:
            for name, at, data, n in members(f, size):
                key, ext = _split_key(name)
                if name.rpartition("/")[2].startswith("."):
                    continue  # no key: a hidden file (macOS's ._ files), not a sample (webdataset skips it too)
                if key == dropped:
                    continue
                if samples and samples[-1][0] == key:
                    if ext in samples[-1][1]:
                        what = (f"sample '{key}' has two '.{ext}' members (the second at byte {at}); a sample "
                                "holds one member per extension")
                        if on_bad == "fail":
                            raise DataError(f"{path}: {what}: rewrite the shard, or set data.on_bad_shard=skip")
                        samples.pop()
                        dropped = key
                        damage.add(path, what, samples=1)
                        continue
                    samples[-1][1][ext] = (data, n)
                else:
                    samples.append((key, {ext: (data, n)}))
    except TarDamage as exc:
        bad = exc.what
        if exc.cut:
            lost = 1  # the member's sample is incomplete; its members before the cut go too
            if samples and samples[-1][0] == _split_key(exc.name)[0]:
                samples.pop()
    if bad is None:
        return samples
    if on_bad == "fail":
        raise DataError(f"{path}: {bad}; rewrite or remove the shard, or set data.on_bad_shard=skip")
    damage.add(path, bad, samples=lost)
    return samples


def _decode_label(raw: bytes, ext: str, where: str) -> int:
    try:
        v = json.loads(raw) if ext == "json" else int(raw.decode().strip())
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{v!r} is not an integer")
        return v
    except (ValueError, UnicodeDecodeError) as exc:
        raise DataError(f"{where}: the label member .{ext} does not hold one integer ({exc}); fix the shard") from None


def _decode_feature(raw: bytes, ext: str, where: str) -> np.ndarray:
    try:
        if ext == "json":
            a = np.asarray(json.loads(raw), dtype=np.float32)
        else:
            a = np.load(io.BytesIO(raw), allow_pickle=False)
    except (ValueError, OSError, EOFError, TypeError) as exc:
        raise DataError(f"{where}: cannot decode the .{ext} member ({' '.join(str(exc).split())[:160]}); "
                        "the shard is damaged: rewrite or remove it, or set data.on_bad_shard=skip") from None
    if a.dtype == object or not (np.issubdtype(a.dtype, np.number) or a.dtype == np.bool_):
        raise DataError(f"{where}: the .{ext} member holds {a.dtype}, not numbers; store numeric arrays")
    return a


def _pick(exts: list[str], target: str, features, where: str) -> tuple[str, str]:
    """(feature ext, label ext) from a sample's extensions, data.target and data.features."""
    label = target if target in exts else next((e for e in LABEL_EXTS if e in exts and target == "label"), None)
    if label is None:
        raise DataError(f"{where}: no label member '.{target}' (members: {exts}); set data.target to the label's "
                        "extension (cls, label, txt or json)")
    rest = list(features) if features else [e for e in exts if e != label]
    if len(rest) != 1:
        raise DataError(f"{where}: {'no' if not rest else 'several'} feature members ({rest or exts}); set "
                        "data.features to the one extension that holds the sample (e.g. [npy])")
    if rest[0] not in exts:
        raise DataError(f"{where}: no feature member '.{rest[0]}' (members: {exts}); fix data.features")
    if rest[0].rsplit(".", 1)[-1] not in FEATURE_EXTS:
        raise DataError(f"{where}: the feature member '.{rest[0]}' is not npy or json; write the samples as .npy")
    return rest[0], label


class TarShardSource:
    """Map-style access to tar shards by the start-up index (see the module's docstring)."""

    def __init__(self, shards: list[Path], shard_of: np.ndarray, offset: np.ndarray, size: np.ndarray,
                 keys: list[str], ext: str, labels: torch.Tensor, shape, dtype, digest: str, on_bad: str):
        self.shards, self.shard_of, self.offset, self.size = shards, shard_of, offset, size
        self.keys, self.ext, self._labels, self.digest, self.on_bad = keys, ext, labels, digest, on_bad
        self.shape, self.dtype = tuple(shape), dtype
        self.n = len(offset)
        self.shard_start = np.concatenate([[0], np.cumsum(np.bincount(shard_of, minlength=len(shards)))[:-1]])
        self._fds = OpenFiles(self._open_shard, os.close)  # a bounded few open: any number of shards
        self.last_dropped: list[int] = []  # rows of the last `take` skipped as damaged (on_bad_shard=skip)
        self.damage = Damage()  # what on_bad_shard=skip left out at start-up (load_shards sets it)
        self._warned: set[int] = set()

    def __len__(self) -> int:
        return self.n

    def labels(self) -> torch.Tensor:
        return self._labels

    def hash_into(self, h) -> None:
        h.update(self.digest.encode())

    def shard_sizes(self, rows: torch.Tensor) -> list[int]:
        """How many of `rows` (sorted sample ids) fall in each shard: the sampler's blocks."""
        return np.bincount(self.shard_of[rows.numpy()], minlength=len(self.shards)).tolist()

    def where(self, row: int) -> str:
        return f"{self.shards[self.shard_of[row]]} sample '{self.keys[row]}' at byte {self.offset[row]}"

    def _open_shard(self, shard: int) -> int:
        return os.open(safefile.regular(self.shards[shard], "tar shard", error=DataError), os.O_RDONLY)

    def take(self, idx: torch.Tensor):
        rows = idx.tolist()
        xs, kept, dropped = [], [], []
        for r in rows:
            raw = os.pread(self._fds.get(int(self.shard_of[r])), int(self.size[r]), int(self.offset[r]))
            try:
                if len(raw) != self.size[r]:
                    raise DataError(f"{self.where(r)}: the shard is shorter than at start-up (it changed "
                                    "during the run); restore it")
                a = _decode_feature(raw, self.ext, self.where(r))
                if a.shape != self.shape or a.dtype != self.dtype:
                    raise DataError(f"{self.where(r)}: holds {a.dtype}{list(a.shape)}, sample 0 "
                                    f"{self.dtype}{list(self.shape)}; every sample must have the same shape and type")
            except DataError as exc:
                if self.on_bad != "skip":
                    raise
                if r not in self._warned:  # once per sample and process: every epoch reads it again
                    self._warned.add(r)
                    log.warning(f"data.on_bad_shard=skip: {str(exc).split(';')[0]}; left out")
                dropped.append(r)
                continue
            xs.append(a)
            kept.append(r)
        self.last_dropped = dropped
        if not xs:
            raise DataError(f"{self.where(rows[0])}: every sample of a batch is damaged; rewrite or remove the shard")
        return torch.from_numpy(np.stack(xs)), self._labels[torch.as_tensor(kept)]


def load_tars(shards: list[Path], digest_root: Path, cfg, damage: Damage) -> tuple[TarShardSource, Damage]:
    """Scan every shard, read the labels, check the first sample; one line for what is wrong."""
    shard_of, offset, size, keys, labels = [], [], [], [], []
    feat = lab = None
    for i, path in enumerate(shards):
        samples = _scan(path, cfg.on_bad_shard, damage)
        if not samples and path.name not in damage.shards:
            if cfg.on_bad_shard == "fail":
                raise DataError(f"{path}: an empty shard (no samples); remove it")
            damage.add(path, "an empty shard")
            continue
        with safefile.open_regular(path, "tar shard", error=DataError) as f:
            for key, members in samples:
                where = f"{path} sample '{key}'"
                if feat is None:
                    feat, lab = _pick(sorted(members), cfg.target, cfg.features, where)
                if feat not in members or lab not in members:
                    miss = feat if feat not in members else lab
                    if cfg.on_bad_shard == "fail":
                        raise DataError(f"{where}: no .{miss} member (members: {sorted(members)}); every sample "
                                        "needs the same members; fix the shard or set data.on_bad_shard=skip")
                    damage.add(path, f"sample '{key}' has no .{miss} member", samples=1)
                    continue
                lo, n = members[lab]
                f.seek(lo)
                labels.append(_decode_label(f.read(n), lab.rsplit(".", 1)[-1], where))
                shard_of.append(i)
                offset.append(members[feat][0])
                size.append(members[feat][1])
                keys.append(key)
    if not keys:
        raise DataError(f"data.name: {shards[0].parent}: no readable samples in {len(shards)} shard(s)")
    src_args = (np.asarray(shard_of, dtype=np.int64), np.asarray(offset, dtype=np.int64),
                np.asarray(size, dtype=np.int64), keys, feat)
    with safefile.open_regular(shards[shard_of[0]], "tar shard", error=DataError) as f:
        f.seek(offset[0])
        a0 = _decode_feature(f.read(size[0]), feat.rsplit(".", 1)[-1], f"{shards[shard_of[0]]} sample '{keys[0]}'")
    digest = fingerprint(digest_root, shards, extra=f"tar\0{feat}\0{lab}\0{cfg.on_bad_shard}".encode())
    src = TarShardSource(shards, *src_args[:4], feat.rsplit(".", 1)[-1], torch.tensor(labels, dtype=torch.int64),
                         a0.shape, a0.dtype, digest, cfg.on_bad_shard)
    return src, damage
