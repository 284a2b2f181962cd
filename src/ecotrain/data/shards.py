"""`data.name: parquet:FOLDER`: a folder of Parquet shards, streamed, never loaded whole.

Rows are numbered across the shards in file-name order. At start-up only the footers are read
(row counts, row groups, schema: one clear line for an unreadable, truncated or empty shard, a
missing column or a schema that changes between shards) plus the label column (for the splits
and the class count). During training `take` decodes the row groups a batch touches and keeps
the most recent ones: `WindowSampler` (data/sampler.py) reads the shards in a seeded order and
shuffles rows only within windows of `data.shuffle_window` rows, so a batch touches a few row
groups and each is decoded about once per epoch (per loader worker).
"""

from __future__ import annotations

import itertools
import os
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch

from ecotrain.base import safefile
from ecotrain.data import braces
from ecotrain.data.columns import feature_columns, fingerprint, labels_of, need, table_xy
from ecotrain.data.openfiles import OpenFiles
from ecotrain.data.tarshards import Damage, load_tars
from ecotrain.base.errors import DataError


def _open(pq, path: Path):
    path = safefile.regular(path, "parquet shard", error=DataError)  # pyarrow opens it by name: no FIFO, no device
    try:
        return pq.ParquetFile(path, page_checksum_verification=True)  # checks the pages when written with CRCs
    except TypeError:  # an older pyarrow without the option
        return pq.ParquetFile(path)


def _close(f) -> None:
    close = getattr(f, "close", None)  # pyarrow >= 13; an older ParquetFile closes when dropped
    if close is not None:
        close()


class ShardSource:
    def __init__(self, folder: Path, shards: list[Path], groups: list[tuple[int, int, int]], cols: list[str],
                 target: str, labels: torch.Tensor, digest: str, cache_groups: int):
        self.folder, self.shards, self.cols, self.target = folder, shards, cols, target
        self.group_shard = np.array([g[0] for g in groups], dtype=np.int64)  # shard of each row group
        self.group_index = np.array([g[1] for g in groups], dtype=np.int64)  # its index in that shard
        sizes = np.array([g[2] for g in groups], dtype=np.int64)
        self.group_start = np.concatenate([[0], np.cumsum(sizes)[:-1]])  # first global row of each group
        self.n = int(sizes.sum())
        shard_rows = np.bincount(self.group_shard, weights=sizes, minlength=len(shards)).astype(np.int64)
        self.shard_start = np.concatenate([[0], np.cumsum(shard_rows)[:-1]])
        self._labels, self.digest, self.cache_groups = labels, digest, cache_groups
        self._files = OpenFiles(self._open_shard, _close)  # a bounded few open: any number of shards
        self._cache: OrderedDict = OrderedDict()  # row group -> (x, y), most recent last
        self.damage = Damage()  # what data.on_bad_shard=skip left out at start-up (load_shards sets it)

    def __len__(self) -> int:
        return self.n

    def labels(self) -> torch.Tensor:
        return self._labels

    def hash_into(self, h) -> None:
        h.update(self.digest.encode())

    def shard_sizes(self, rows: torch.Tensor) -> list[int]:
        """How many of `rows` (sorted global row ids) fall in each shard: the sampler's blocks."""
        shard = np.searchsorted(self.shard_start, rows.numpy(), side="right") - 1
        return np.bincount(shard, minlength=len(self.shards)).tolist()

    def take(self, idx: torch.Tensor):
        rows = idx.numpy()
        group = np.searchsorted(self.group_start, rows, side="right") - 1
        x = y = None
        for g in np.unique(group):
            sel = np.flatnonzero(group == g)
            gx, gy = self._group(int(g))
            local = torch.from_numpy(rows[sel] - self.group_start[g])
            if x is None:
                x = gx.new_empty((len(rows), *gx.shape[1:]))
                y = gy.new_empty((len(rows),))
            pos = torch.from_numpy(sel)
            x[pos], y[pos] = gx[local], gy[local]
        return x, y

    def _group(self, g: int):
        hit = self._cache.get(g)
        if hit is not None:
            self._cache.move_to_end(g)
            return hit
        shard, index = int(self.group_shard[g]), int(self.group_index[g])
        path = self.shards[shard]
        try:
            table = self._files.get(shard).read_row_group(index, columns=[*self.cols, self.target])
        except OSError as exc:  # pyarrow's ArrowException is an OSError: damaged pages, a changed file
            raise DataError(f"{path}: cannot read row group {index} ({' '.join(str(exc).split())[:200]}); "
                            "the shard is damaged: rewrite or remove it") from None
        where = f"{path} row group {index}"
        out = table_xy(table, self.cols, self.target, where)
        self._cache[g] = out
        while len(self._cache) > self.cache_groups:
            self._cache.popitem(last=False)
        return out

    def _open_shard(self, shard: int):
        return _open(need("pyarrow.parquet", "parquet"), self.shards[shard])


def load_parquet(folder: str, cfg) -> tuple[ShardSource, torch.Size]:
    """`parquet:FOLDER`: every .parquet file of the folder, in name order."""
    root = Path(folder)
    if not root.is_dir():
        raise DataError(f"data.name=parquet:{folder}: not a folder" + (" (give the folder of .parquet shards)"
                                                                          if root.is_file() else ""))
    shards = sorted(p for p in root.iterdir() if p.suffix == ".parquet" and p.is_file())
    if not shards:
        raise DataError(f"{root}: no .parquet shards in this folder")
    src, _ = load_parquet_files(shards, root, cfg, Damage())
    return src, src.take(torch.tensor([0]))[0].shape[1:]


def load_parquet_files(shards: list[Path], root: Path, cfg, damage: Damage) -> tuple[ShardSource, Damage]:
    """Check every shard's footer and columns; read the labels. A bad shard is one line
    (data.on_bad_shard=fail) or left out and counted in `damage` (skip)."""
    pq = need("pyarrow.parquet", f"data.name={cfg.name}")
    groups, schema0, cols, labels, kept, meta = [], None, None, [], [], None
    for path in shards:
        try:
            meta = _footer(pq, path)
            schema = meta.schema.to_arrow_schema()
            if schema0 is not None and not schema.equals(schema0):
                raise DataError(f"{path}: schema differs from {kept[0].name}: {_schema_diff(schema0, schema)}; "
                                "every shard must have the same columns and types")
            if schema0 is None:  # the columns asked for are the recipe's: that error is never skipped
                cols = feature_columns(schema.names, cfg.features, cfg.target, str(path))
            try:
                lab = labels_of(pq.read_table(safefile.regular(path, "parquet shard", error=DataError), columns=[cfg.target]).column(0), cfg.target, str(path))
            except OSError as exc:
                raise DataError(f"{path}: cannot read the label column ({' '.join(str(exc).split())[:200]}); "
                                "the shard is damaged: rewrite or remove it") from None
        except DataError as exc:
            recipe = cols is None and meta is not None  # feature_columns refused data.target/data.features
            if cfg.on_bad_shard != "skip" or recipe:
                raise
            damage.add(path, str(exc).removeprefix(f"{path}: ").split(";")[0])
            meta = None
            continue
        schema0 = schema0 or schema
        groups += [(len(kept), g, meta.row_group(g).num_rows) for g in range(meta.num_row_groups)]
        labels.append(lab)
        kept.append(path)
        meta = None
    if not kept:
        raise DataError(f"data.name={cfg.name}: no readable shard among {len(shards)}")
    rows_per_group = max(1, min(g[2] for g in groups))
    cache = cfg.shuffle_window // rows_per_group + 3  # the groups a window spans, and its neighbours
    digest = fingerprint(root, kept, extra=f"parquet\0{cols}\0{cfg.target}".encode())
    return ShardSource(root, kept, groups, cols, cfg.target, torch.cat(labels), digest, cache), damage


def _footer(pq, path: Path):
    try:
        meta = _open(pq, path).metadata
    except Exception as exc:  # truncated (no footer), not Parquet, unreadable
        raise DataError(f"{path}: not a readable Parquet shard ({' '.join(str(exc).split())[:200]}); "
                        "rewrite or remove it") from None
    if meta.num_rows == 0:
        raise DataError(f"{path}: an empty shard (0 rows); remove it")
    return meta


MAX_SHARDS = 1_000_000  # a run's shards, at most: start-up opens each, so more is a mistyped pattern


SUFFIXES = (".tar", ".parquet")  # what a folder named by `shards:` contributes; token shards add ".bin"


def is_pattern(name: str) -> bool:
    """Whether `name` is a pattern (a glob, braces, a comma list) rather than one path."""
    return any(c in name for c in "*?[{,")


def expand(pattern: str, more: tuple[str, ...] = (), what: str = "") -> list[Path]:
    """`shards:PATTERN`: a folder (its .tar or .parquet files, and those ending in `more`: data/tokens.py
    adds .bin), a glob (`data/train-*.tar`), WebDataset's brace range (`train-{000..199}.tar`) or a
    comma-separated list; globs and folders in name order. A brace pattern is counted before it is
    expanded; listing stops past MAX_SHARDS shards in all. `what` names the setting in messages."""
    what = what or f"data.name=shards:{pattern}"
    suffixes = SUFFIXES + tuple(more)
    kinds = ", ".join(suffixes[:-1]) + " or " + suffixes[-1]
    parts = [(part, braces.parse(part, pattern)) for part in braces.split_top(pattern)]
    named = sum(braces.count(seq) for _, seq in parts)
    if named > MAX_SHARDS:
        raise DataError(f"{what}: the pattern names {named:,} shards, over the cap of "
                        f"{MAX_SHARDS:,}; name a narrower range, or pack the samples into fewer, larger shards")
    out: list[Path] = []
    for name in (n for _, seq in parts for n in braces.expand(seq)):
        p = Path(name)
        if p.is_dir():
            found = (f for f in p.iterdir() if f.is_file() and f.suffix in suffixes)
        elif any(c in name for c in "*?["):
            found = (f for f in p.parent.glob(p.name) if f.is_file())
        elif p.is_file():
            found = iter([p])
        else:
            raise DataError(f"{what}: no such shard file or folder: {name}")
        more_found = list(itertools.islice(found, MAX_SHARDS + 1 - len(out)))  # a huge folder is not listed whole
        if len(out) + len(more_found) > MAX_SHARDS:
            raise DataError(f"{what}: more than {MAX_SHARDS:,} shards, the cap; name fewer, "
                            "or pack the samples into fewer, larger shards")
        out += sorted(more_found)
    if not out:
        raise DataError(f"{what}: matches no {kinds} file")
    seen: set[Path] = set()
    for f in out:  # a set, not list.count: 10,000 shards are checked in milliseconds
        if f in seen:
            raise DataError(f"{what}: {f} is named twice; each shard once")
        seen.add(f)
    return out


def load_shards(pattern: str, cfg):
    """`shards:PATTERN` -> (source, Damage): tar shards (data/tarshards.py) or Parquet shards."""
    if cfg.kwargs:  # the config lets them through for .bin token shards (data/tokens.py)
        raise DataError(f"data.kwargs {sorted(cfg.kwargs)}: data.name={cfg.name} (tar or Parquet shards) takes none "
                        "(they are for mnist1d, text, tokens:, .bin shards and an import-path Dataset); remove them")
    files = expand(pattern)
    kinds = {f.suffix for f in files}
    if kinds - {".tar", ".parquet"} or len(kinds) > 1:
        raise DataError(f"data.name=shards:{pattern}: the shards are {sorted(kinds)}; give .tar shards, "
                        ".parquet shards or .bin token files, one kind per run")
    root = Path(os.path.commonpath([f.resolve().parent for f in files]))
    files = [f.resolve() for f in files]
    src, damage = (load_tars if kinds == {".tar"} else load_parquet_files)(files, root, cfg, Damage())
    src.damage = damage
    return src


def _schema_diff(a, b) -> str:
    for name in dict.fromkeys([*a.names, *b.names]):
        if name not in b.names:
            return f"column '{name}' is missing"
        if name not in a.names:
            return f"column '{name}' is new"
        ta, tb = a.field(name).type, b.field(name).type
        if ta != tb:
            return f"column '{name}' is {tb}, there {ta}"
    return "the column order or metadata differ"
