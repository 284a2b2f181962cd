"""Token files as nanoGPT writes them: `data.name: tokens:PATH`, a flat array of uint16 or uint32
token ids, memory-mapped with NumPy (nothing is read whole).

PATH is a `.bin` file or a folder holding `tokens.json` (the sidecar `ecotrain tokenize` writes:
dtype, vocabulary size, end-of-document id, the split files, the tokenizer). Window i of a split is
tokens `[i * stride, i * stride + seq_len + 1)`: input and target shifted by one. Validation and
test are files of their own (`data.kwargs.val`/`test`, or the sidecar's) or the stream's tail
(`data.val_split`, `data.test_split`), cut between windows so no token is in two splits. Every id
is checked against the vocabulary at start-up (one line naming the first bad position).

The position a checkpoint keeps is the sampler's batch index (data/sampler.py): epoch e's window
order is a function of (seed, e), so a resumed run reads exactly the windows the uninterrupted run
reads, whichever token the kill fell on.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ecotrain.config_tokens import SIDECAR, TokensMeta, TokensOptions, parse
from ecotrain.data.packing import document_mask, mask_boundaries
from ecotrain.data.sources import DataBundle
from ecotrain.errors import DataError
from ecotrain.jsonfile import read_json
from ecotrain.userpath import user_path

_CHECK = 1 << 24  # ids checked per read at start-up: 64 MiB of uint32 at a time, whatever the file's size
_HASH_BYTES = 64 * 1024  # the content hash reads this much of each file's head and tail, as for hf:/parquet:
_FIX = "rewrite it with `ecotrain tokenize`, or fix data.kwargs"


class TokenFile:
    """One `.bin` file of `dtype` ids, memory-mapped when first read (again in a process it is sent to)."""

    def __init__(self, path: Path, dtype: str):
        self.path, self.dtype = Path(path), np.dtype(dtype)
        try:
            self.size = os.stat(self.path).st_size
        except OSError as exc:
            raise DataError(f"{self.path}: cannot read the token file ({exc.strerror})") from None
        width = self.dtype.itemsize
        if self.size == 0:
            raise DataError(f"{self.path}: an empty token file (0 bytes); tokenize some text into it")
        if self.size % width:
            raise DataError(f"{self.path}: {self.size:,} bytes is not a whole number of {dtype} ids ({width} bytes "
                            f"each); the file is truncated or holds another dtype (data.kwargs.dtype)")
        self.n = self.size // width
        self._arr: Optional[np.memmap] = None

    @property
    def arr(self) -> np.memmap:
        if self._arr is None:
            try:
                self._arr = np.memmap(self.path, dtype=self.dtype, mode="r", shape=(self.n,))
            except (OSError, ValueError) as exc:
                raise DataError(f"{self.path}: cannot map the token file ({exc})") from None
        return self._arr

    def __getstate__(self) -> dict:
        return dict(self.__dict__, _arr=None)  # a memmap pickles as a copy of the whole file: map it again

    def still_whole(self) -> None:
        """Reading a mapped page past a file's end is SIGBUS (no error, a dead process): a file cut
        short since start-up is one line instead."""
        try:
            size = os.stat(self.path).st_size
        except OSError as exc:
            raise DataError(f"{self.path}: the token file went away during training ({exc.strerror})") from None
        if size < self.size:
            raise DataError(f"{self.path}: the token file shrank from {self.size:,} to {size:,} bytes during "
                            "training; restore it, then resume")

    def check_ids(self, vocab: int) -> None:
        """Every id below `vocab`, read in chunks; the first one that is not, by position."""
        a = self.arr
        for start in range(0, self.n, _CHECK):
            chunk = a[start:start + _CHECK]
            if int(chunk.max()) >= vocab:
                at = int(np.argmax(chunk >= vocab))
                raise DataError(f"{self.path}: token id {int(chunk[at]):,} at position {start + at:,} is not below "
                                f"the vocabulary size {vocab:,}; set data.kwargs.vocab_size to the tokenizer's "
                                "(or check data.kwargs.dtype)")

    def hash_into(self, h) -> None:
        h.update(f"tokens:{self.path.name}:{self.size}:{self.dtype}".encode())
        try:
            with open(self.path, "rb") as f:
                h.update(f.read(_HASH_BYTES))
                f.seek(max(0, self.size - _HASH_BYTES))
                h.update(f.read(_HASH_BYTES))
        except OSError as exc:
            raise DataError(f"{self.path}: cannot read the token file ({exc.strerror})") from None


class TokenSource:
    """The windows of tokens `[start, stop)` of one file. `take` gives `(x, y)` int64 `[b, seq_len]`,
    or with `attention: document` a dict `{input_ids, labels, attention_mask}`."""

    def __init__(self, file: TokenFile, start: int, stop: int, opts: TokensOptions, vocab: int,
                 eod: Optional[int]):
        self.file, self.start, self.stop = file, start, stop
        self.seq_len, self.stride = opts.seq_len, opts.stride or opts.seq_len
        self.vocab, self.eod = vocab, eod
        self.mask = opts.mask_boundaries and eod is not None
        self.document = opts.attention == "document"
        span = stop - start - (self.seq_len + 1)
        self.n = span // self.stride + 1 if span >= 0 else 0
        self._offsets = np.arange(self.seq_len + 1, dtype=np.int64)

    def __len__(self) -> int:
        return self.n

    def take(self, idx):
        starts = self.start + idx.numpy().astype(np.int64) * self.stride
        self.file.still_whole()
        w = torch.from_numpy(self.file.arr[starts[:, None] + self._offsets].astype(np.int64))
        if int(w.max()) >= self.vocab:  # the file was rewritten since its ids were checked
            row, col = divmod(int((w >= self.vocab).reshape(-1).nonzero()[0, 0]), self.seq_len + 1)
            raise DataError(f"{self.file.path}: token id {int(w[row, col]):,} at position {int(starts[row]) + col:,} "
                            f"is not below the vocabulary size {self.vocab:,}; the file changed since start-up")
        x, y = w[:, :-1], w[:, 1:]
        if self.mask:
            y = mask_boundaries(x, y, self.eod)
        if self.document:
            return {"input_ids": x, "labels": y, "attention_mask": document_mask(x, self.eod)}
        return x, y

    def labels(self):
        raise DataError("data: a token stream has no class labels; this feature needs (x, y) class data")

    def hash_into(self, h) -> None:
        self.file.hash_into(h)
        h.update(f"{self.start}:{self.stop}:{self.seq_len}:{self.stride}:{self.eod}:{self.mask}".encode())


def _meta(folder: Path, required: bool) -> Optional[TokensMeta]:
    path = folder / SIDECAR
    if not path.exists():
        if required:
            raise DataError(f"data.name: {folder} holds no {SIDECAR}; give the .bin file itself (tokens:FILE.bin) "
                            "with data.kwargs.dtype and vocab_size, or write the folder with `ecotrain tokenize`")
        return None
    obj = read_json(path, "token files' description", fix=_FIX, error=DataError)
    return parse(TokensMeta, obj, str(path), DataError)


def _beside(folder: Path, name: str, what: str) -> Path:
    """A file the sidecar names: a plain name in its own folder (never a path out of it)."""
    if Path(name).name != name or name in (".", ".."):
        raise DataError(f"{folder / SIDECAR}: the {what} '{name}' is not a file name in its folder; {_FIX}")
    return user_path(folder / name, f"{folder / SIDECAR} {what}", _FIX, error=DataError)


def _settings(opts: TokensOptions, meta: Optional[TokensMeta]) -> tuple[str, int, Optional[int]]:
    """(dtype, vocab size, eod) from data.kwargs, else from tokens.json."""
    if opts.dtype and meta and opts.dtype != meta.dtype:
        raise DataError(f"data.kwargs.dtype: {opts.dtype}, but {SIDECAR} says the files hold {meta.dtype}; "
                        "drop data.kwargs.dtype")
    dtype = opts.dtype or (meta.dtype if meta else None)
    vocab = opts.vocab_size or (meta.vocab_size if meta else None)
    if dtype is None or vocab is None:
        missing = "dtype" if dtype is None else "vocab_size"
        raise DataError(f"data.kwargs.{missing}: required for token files without {SIDECAR} (nanoGPT's GPT-2 "
                        "files: dtype: uint16, vocab_size: 50257)")
    if dtype == "uint16" and vocab > 1 << 16 and not opts.vocab_size:
        raise DataError(f"{SIDECAR}: vocab_size {vocab:,} does not fit uint16 ids; {_FIX}")
    eod = opts.eod if opts.eod is not None else (meta.eod if meta else None)
    if eod is not None and eod >= vocab:
        raise DataError(f"data.kwargs.eod: {eod} is not below the vocabulary size {vocab:,}")
    if opts.attention == "document" and eod is None:
        raise DataError("data.kwargs.attention: document needs the end-of-document id (data.kwargs.eod, or "
                        f"{SIDECAR}'s eod)")
    return dtype, vocab, eod


def _split_file(given: Optional[str], meta, folder: Path, split: str, own: bool) -> Optional[Path]:
    """A split's own file: data.kwargs.<split>, else the sidecar's (when PATH is its folder or its train file)."""
    if given:
        return user_path(given, f"data.kwargs.{split}", "give a .bin token file", error=DataError)
    if own and meta and split in meta.files:
        return _beside(folder, meta.files[split], f"{split} file")
    return None


def load_tokens(cfg) -> DataBundle:
    opts = parse(TokensOptions, dict(cfg.data.kwargs), "data.kwargs", DataError)
    path = cfg.data.name.partition(":")[2]
    if not path:
        raise DataError("data.name: 'tokens:' needs a path: tokens:FILE.bin, or tokens:FOLDER holding tokens.json")
    p = user_path(path, "data.name", "give a .bin token file, or a folder holding tokens.json", folder=True,
                  error=DataError)
    folder = p if p.is_dir() else p.parent
    meta = _meta(folder, required=p.is_dir())
    dtype, vocab, eod = _settings(opts, meta)
    if p.is_dir():
        if "train" not in meta.files:
            raise DataError(f"{folder / SIDECAR}: names no train file; {_FIX}")
        p = _beside(folder, meta.files["train"], "train file")
    own = meta is not None and meta.files.get("train") == p.name  # the sidecar describes this file's splits
    train_file = TokenFile(p, dtype)
    files = {"train": train_file}
    for split in ("val", "test"):
        f = _split_file(getattr(opts, split), meta, folder, split, own)
        if f is not None:
            files[split] = TokenFile(f, dtype)
    for f in files.values():
        f.check_ids(vocab)
    # splits the stream gives: its tail, test last, cut at token positions (windows never straddle)
    n = train_file.n
    n_test = round(n * cfg.data.test_split) if "test" not in files else 0
    n_val = round(n * cfg.data.val_split) if "val" not in files else 0
    cut_val, cut_test = n - n_test - n_val, n - n_test
    train = TokenSource(train_file, 0, cut_val, opts, vocab, eod)
    val = (TokenSource(files["val"], 0, files["val"].n, opts, vocab, eod) if "val" in files else
           TokenSource(train_file, cut_val, cut_test, opts, vocab, eod) if n_val else None)
    test = (TokenSource(files["test"], 0, files["test"].n, opts, vocab, eod) if "test" in files else
            TokenSource(train_file, cut_test, n, opts, vocab, eod) if n_test else None)
    for name, src in (("train", train), ("validation", val), ("test", test)):
        if src is not None and len(src) == 0:
            tokens = src.stop - src.start
            raise DataError(f"data: the {name} split holds {tokens:,} tokens, too few for one window of seq_len + 1 = "
                            f"{opts.seq_len + 1}; lower data.kwargs.seq_len, or give more tokens "
                            f"({'a larger split fraction or ' if src.file is train_file and name != 'train' else ''}"
                            "a longer file)")
    tokenizer = _beside(folder, meta.tokenizer, "tokenizer") if own and meta.tokenizer else None
    extra = {"task": "lm", "tokens": {k: s.stop - s.start for k, s in (("train", train), ("val", val), ("test", test))
                                      if s is not None}}
    if tokenizer is not None:
        extra["tokenizer"] = str(tokenizer)
    return DataBundle(train, val, test, vocab, (opts.seq_len,), extra=extra, sample=train.take(torch.tensor([0])))
