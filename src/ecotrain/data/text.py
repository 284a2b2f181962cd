"""A text corpus that ships on every machine: the Python standard library's own source files.

`data.name: text` reads the `.py` files under `sysconfig.get_paths()["stdlib"]` (site-packages,
tests and caches left out) in sorted path order, so the same Python gives the same bytes, up to
`max_bytes` (after the first `offset` bytes: another part of the same stream, the shifted corpus of
an `ecotrain update`). The vocabulary is the 256 byte values. Two shapes:

- `mode: packed` (default): the byte stream cut into `seq_len + 1` windows; input and target are
  the window shifted by one, with no padding.
- `mode: paragraphs`: one sequence per blank-line-separated paragraph (at least `min_len`
  bytes, cut at `seq_len`): variable lengths, right-padded per batch to its longest member.
  Padded targets are IGNORE, so the loss and the token count (task.LanguageModelTask) skip them.
"""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path
from typing import Optional

import torch

from ecotrain.base import safefile
from ecotrain.data.sources import DataBundle
from ecotrain.base.errors import DataError

IGNORE = -100  # target id the loss skips (F.cross_entropy's default ignore_index)
VOCAB = 256
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idlelib"}


def stdlib_files(root: Optional[str] = None) -> list[Path]:
    root = Path(root or sysconfig.get_paths()["stdlib"])
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        out += [Path(dirpath, f) for f in sorted(filenames) if f.endswith(".py")]
    return sorted(out, key=lambda p: p.relative_to(root).as_posix())


def read_corpus(max_bytes: int, offset: int = 0) -> list[bytes]:
    """The stdlib's files in path order, from byte `offset` of their stream, until `max_bytes` in all
    (the first and last cut)."""
    texts, total, skip = [], 0, offset
    for path in stdlib_files():
        if total >= max_bytes:
            break
        if skip and path.stat().st_size <= skip:  # wholly before the offset: not read
            skip -= path.stat().st_size
            continue
        b = safefile.read_bytes(path, "stdlib source file", 64 * safefile.MiB, error=DataError)[skip: skip + max_bytes - total]
        skip = 0
        if b:
            texts.append(b)
            total += len(b)
    return texts


class TextSource:
    """Rows of token ids `[n, T+1]` (int16, IGNORE-padded); `take` returns (input, next-token target),
    cut to the batch's longest row when `lengths` (input lengths) are given."""

    def __init__(self, rows: torch.Tensor, lengths: Optional[torch.Tensor] = None):
        self.rows, self.lengths = rows, lengths

    def __len__(self) -> int:
        return len(self.rows)

    def take(self, idx):
        w = self.rows[idx]
        if self.lengths is not None:
            w = w[:, : int(self.lengths[idx].max()) + 1]
        w = w.long()
        x = w[:, :-1]
        return (x.clamp_min(0) if self.lengths is not None else x), w[:, 1:]  # pad inputs read byte 0

    def labels(self):
        return self.rows[:, 1:]

    def subset(self, idx: torch.Tensor) -> "TextSource":
        return TextSource(self.rows[idx], None if self.lengths is None else self.lengths[idx])

    def hash_into(self, h) -> None:
        h.update(str(tuple(self.rows.shape)).encode())
        h.update(self.rows.contiguous().numpy().tobytes())


def _stream(b: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(b), dtype=torch.uint8).to(torch.int16)


def packed_rows(texts: list[bytes], seq_len: int) -> torch.Tensor:
    data = _stream(b"".join(texts))
    if len(data) < seq_len + 1:
        raise DataError(f"data.kwargs.max_bytes: {len(data)} bytes make no window of seq_len={seq_len}")
    return data.unfold(0, seq_len + 1, seq_len)  # a view: windows share their boundary byte


def paragraph_rows(texts: list[bytes], seq_len: int, min_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    paras = [p.strip(b"\n")[: seq_len + 1] for t in texts for p in t.split(b"\n\n")]
    paras = [p for p in paras if len(p) > min_len]
    if not paras:
        raise DataError(f"data.kwargs: no paragraph longer than min_len={min_len}")
    rows = torch.full((len(paras), seq_len + 1), IGNORE, dtype=torch.int16)
    for i, p in enumerate(paras):
        rows[i, : len(p)] = _stream(p)
    return rows, torch.tensor([len(p) - 1 for p in paras])


def _int_option(kw: dict, key: str, default: int, minimum: int) -> int:
    v = kw.pop(key, default)
    if isinstance(v, float) and v.is_integer():  # 2000000.0
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise DataError(f"data.kwargs.{key}: must be an integer >= {minimum} (got {v!r})")
    return v


def load_text(cfg) -> DataBundle:
    kw = dict(cfg.data.kwargs)
    seq_len = _int_option(kw, "seq_len", 256, 1)
    max_bytes = _int_option(kw, "max_bytes", 2_000_000, 1)
    mode = kw.pop("mode", "packed")
    min_len = _int_option(kw, "min_len", 16, 0)
    offset = _int_option(kw, "offset", 0, 0)
    if kw:
        raise DataError(f"data.kwargs.{next(iter(kw))}: not a text option (seq_len, max_bytes, mode, min_len, offset)")
    if mode not in ("packed", "paragraphs"):
        raise DataError(f"data.kwargs.mode: '{mode}' is not packed or paragraphs")
    texts = read_corpus(max_bytes, offset)
    if not texts:
        raise DataError(f"data.kwargs.offset: {offset:,} is past the end of the standard library's source; lower it")
    if mode == "packed":
        base = TextSource(packed_rows(texts, seq_len))
    else:
        base = TextSource(*paragraph_rows(texts, seq_len, min_len))
    n = len(base)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(cfg.seed))
    n_test, n_val = round(n * cfg.data.test_split), round(n * cfg.data.val_split)
    if n - n_test - n_val < 1 or (cfg.data.val_split > 0 and n_val == 0):
        got = sum(map(len, texts))
        fix = ("raise data.kwargs.max_bytes" if got >= max_bytes else  # the stdlib ran out first: more bytes are not there
               f"the source ends {got:,} bytes after data.kwargs.offset {offset:,}: lower the offset or data.kwargs.seq_len")
        raise DataError(f"data: {n} text sequences are too few for the splits; {fix}")
    test = base.subset(perm[:n_test].sort().values) if n_test else None
    val = base.subset(perm[n_test : n_test + n_val].sort().values) if n_val else None
    train = base.subset(perm[n_test + n_val :].sort().values)
    per_sample = float(seq_len) if train.lengths is None else float(train.lengths.float().mean())  # real tokens
    return DataBundle(train, val, test, VOCAB, (seq_len,),
                      extra={"task": "lm", "lengths": train.lengths, "text_bytes": sum(map(len, texts)),
                             "bytes_per_token": 1.0, "tokens_per_sample": per_sample})  # byte-level: 1 byte a token
