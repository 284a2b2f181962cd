"""Token files as nanoGPT writes them: `data.name: tokens:PATH`, a flat array of uint16 or uint32
token ids, memory-mapped with NumPy (nothing is read whole); `data.name: shards:PATTERN` of such
`.bin` files, read as one stream.

PATH is a `.bin` file or a folder holding `tokens.json` (the sidecar `ecotrain tokenize` writes:
dtype, vocabulary size, end-of-document id, the split files, the tokenizer, the corpus's bytes).
PATTERN is what `shards:` takes (data/shards.py `expand`: a folder, a glob, a brace range
`fineweb_train_{000001..000009}.bin`, a comma list): the files in that order make one stream, so a
window may run from one file into the next. A file that starts with llm.c's 256-int32 header (the
`fineweb_*.bin` shards of llm.c and modded-nanogpt: magic 20240520 for GPT-2's uint16 ids, 20240801
for Llama 3's uint32) is read past its header, with the dtype and token count the header gives.

Window i of a split is tokens `[i * stride, i * stride + seq_len + 1)`: input and target shifted by
one. Validation and test are files of their own (`data.kwargs.val`/`test`: a file or a pattern, or
the sidecar's) or the stream's tail (`data.val_split`, `data.test_split`), cut between windows so no
token is in two splits. Every id is checked against the vocabulary at start-up (one line naming the
first bad position).

Bits per byte need the corpus's bytes per token: `data.kwargs.bytes_per_token`, else tokens.json's
`bytes` (the UTF-8 bytes `ecotrain tokenize` read) over its `tokens` (every split's ids, end-of-document
ids included); shards in several folders take the sum of their sidecars.

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

from ecotrain.config.tokens import MAX_BYTES_PER_TOKEN, SIDECAR, TokensMeta, TokensOptions, parse
from ecotrain.data.openfiles import OpenFiles
from ecotrain.data.packing import document_mask, mask_boundaries
from ecotrain.data.shards import expand, is_pattern
from ecotrain.data.sources import DataBundle
from ecotrain.base import safefile
from ecotrain.base.errors import DataError
from ecotrain.base.runfiles import TOKENIZER_MAX_BYTES
from ecotrain.base.jsonfile import read_json
from ecotrain.base.userpath import user_path

_CHECK = 1 << 24  # ids checked per read at start-up: 64 MiB of uint32 at a time, whatever the file's size
_HASH_BYTES = 64 * 1024  # the content hash reads this much of each file's head and tail, as for hf:/parquet:
_FIX = "rewrite it with `ecotrain tokenize`, or fix data.kwargs"
HEADER_INTS = 256  # llm.c's header: 256 int32, [magic, version, token count, 0...]
# magic -> (version, dtype, the vocabulary of the tokenizer it names): llm.c dev/data/data_common.py
LLMC = {20240520: (1, "uint16", 50257), 20240801: (7, "uint32", 128256)}


def _header(path: Path, size: int) -> Optional[tuple[str, int, int]]:
    """(dtype, token count, default vocabulary) from an llm.c header, or None for a bare file."""
    if size < 12:
        return None
    try:
        with safefile.open_regular(path, "token file", error=DataError) as f:
            head = np.frombuffer(f.read(12), dtype="<i4")
    except OSError as exc:
        raise DataError(f"{path}: cannot read the token file ({exc.strerror})") from None
    known = LLMC.get(int(head[0]))
    if known is None:
        return None
    version, dtype, vocab = known
    if int(head[1]) != version:
        raise DataError(f"{path}: an llm.c token file (magic {int(head[0])}) of version {int(head[1])}, not "
                        f"{version}; rewrite it with llm.c's data scripts or `ecotrain tokenize`")
    n = int(head[2])
    want = HEADER_INTS * 4 + n * np.dtype(dtype).itemsize
    if n <= 0 or size < want:
        raise DataError(f"{path}: its llm.c header promises {n:,} {dtype} ids ({want:,} bytes) but the file holds "
                        f"{size:,} bytes; the file is truncated: download or write it again")
    if size > want:  # llm.c's own reader refuses it too: ids past the count would be dropped unseen
        raise DataError(f"{path}: its llm.c header promises {n:,} {dtype} ids ({want:,} bytes) but the file holds "
                        f"{size:,} bytes, {size - want:,} past them; the header's count is wrong or the file was "
                        "appended to: write it again with llm.c's data scripts or `ecotrain tokenize`")
    return dtype, n, vocab


def _map(f: "TokenFile") -> np.memmap:
    try:
        return np.memmap(safefile.regular(f.path, "token file", error=DataError), dtype=f.dtype, mode="r",
                         offset=f.offset, shape=(f.n,))
    except (OSError, ValueError) as exc:
        raise DataError(f"{f.path}: cannot map the token file ({exc})") from None


# Every token file's map in this process, the most recently read few kept (data/openfiles.py): a map holds
# a descriptor (Python's mmap keeps a duplicate), so 1,500 files mapped at once fail under `ulimit -n 1024`.
# Dropping a map from the budget drops its last reference once no window taken from it is alive (the windows
# are copies), which unmaps it and closes its descriptor.
_MAPS = OpenFiles(_map, lambda m: None)


class TokenFile:
    """One `.bin` file of `dtype` ids (after llm.c's header, when it has one), memory-mapped when read,
    under the process's descriptor budget (`_MAPS`; again in a process it is sent to). `dtype` None: the
    header's, else refused."""

    def __init__(self, path: Path, dtype: Optional[str], where: str = "data.kwargs.dtype"):
        self.path = Path(path)
        try:
            self.size = os.stat(self.path).st_size
        except OSError as exc:
            raise DataError(f"{self.path}: cannot read the token file ({exc.strerror})") from None
        if self.size == 0:
            raise DataError(f"{self.path}: an empty token file (0 bytes); tokenize some text into it")
        header = _header(self.path, self.size)
        self.vocab_hint: Optional[int] = None  # the vocabulary an llm.c header's tokenizer has
        if header is not None:
            hdtype, self.n, self.vocab_hint = header
            if dtype is not None and dtype != hdtype:
                raise DataError(f"{self.path}: its llm.c header says {hdtype} ids, but {where} says {dtype}; "
                                "drop the setting (the header decides) or give files of one dtype")
            self.dtype, self.offset = np.dtype(hdtype), HEADER_INTS * 4
            return
        if dtype is None:
            raise DataError(f"data.kwargs.dtype: required for token files without {SIDECAR} ({self.path}; "
                            "nanoGPT's GPT-2 files: dtype: uint16, vocab_size: 50257)")
        self.dtype, self.offset = np.dtype(dtype), 0
        width = self.dtype.itemsize
        if self.size % width:
            raise DataError(f"{self.path}: {self.size:,} bytes is not a whole number of {dtype} ids ({width} bytes "
                            f"each); the file is truncated or holds another dtype (data.kwargs.dtype)")
        self.n = self.size // width

    @property
    def arr(self) -> np.memmap:
        """The file's ids, mapped (a read-only view: take copies of what you keep)."""
        return _MAPS.get(self)

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
            with safefile.open_regular(self.path, "token file", error=DataError) as f:
                h.update(f.read(_HASH_BYTES))
                f.seek(max(0, self.size - _HASH_BYTES))
                h.update(f.read(_HASH_BYTES))
        except OSError as exc:
            raise DataError(f"{self.path}: cannot read the token file ({exc.strerror})") from None


class TokenStream:
    """Files read as one stream of ids: position p is file i's id p - start[i]."""

    def __init__(self, files: list[TokenFile]):
        dtypes = {f.dtype for f in files}
        if len(dtypes) > 1:
            a = files[0]
            b = next(f for f in files if f.dtype != a.dtype)
            raise DataError(f"data: shards with mismatched dtypes: {a.path} holds {a.dtype} ids, {b.path} {b.dtype}; "
                            "one stream is one dtype: rewrite one of them (`ecotrain tokenize`)")
        self.files = files
        self.starts = np.concatenate([[0], np.cumsum([f.n for f in files])]).astype(np.int64)
        self.n = int(self.starts[-1])

    def windows(self, starts: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """[k, len(offsets)] int64: the ids at `starts[:, None] + offsets`."""
        pos = starts[:, None] + offsets
        if len(self.files) == 1:
            f = self.files[0]
            f.still_whole()
            return f.arr[pos].astype(np.int64)
        which = np.searchsorted(self.starts, pos, side="right") - 1
        out = np.empty(pos.shape, dtype=np.int64)
        for i in np.unique(which):
            f, sel = self.files[i], which == i
            f.still_whole()
            out[sel] = f.arr[pos[sel] - self.starts[i]]
        return out

    def locate(self, pos: int) -> tuple[Path, int]:
        """(file, position in it) of stream position `pos`."""
        i = int(np.searchsorted(self.starts, pos, side="right") - 1)
        return self.files[i].path, pos - int(self.starts[i])

    def check_ids(self, vocab: int) -> None:
        for f in self.files:
            f.check_ids(vocab)

    def hash_into(self, h) -> None:
        for f in self.files:
            f.hash_into(h)


class TokenSource:
    """The windows of stream positions `[start, stop)`. `take` gives `(x, y)` int64 `[b, seq_len]`,
    or with `attention: document` a dict `{input_ids, labels, attention_mask}`."""

    def __init__(self, stream: TokenStream, start: int, stop: int, opts: TokensOptions, vocab: int,
                 eod: Optional[int]):
        self.stream, self.start, self.stop = stream, start, stop
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
        w = torch.from_numpy(self.stream.windows(starts, self._offsets))
        if int(w.max()) >= self.vocab:  # the file was rewritten since its ids were checked
            row, col = divmod(int((w >= self.vocab).reshape(-1).nonzero()[0, 0]), self.seq_len + 1)
            path, at = self.stream.locate(int(starts[row]) + col)
            raise DataError(f"{path}: token id {int(w[row, col]):,} at position {at:,} is not below the "
                            f"vocabulary size {self.vocab:,}; the file changed since start-up")
        x, y = w[:, :-1], w[:, 1:]
        if self.mask:
            y = mask_boundaries(x, y, self.eod)
        if self.document:
            return {"input_ids": x, "labels": y, "attention_mask": document_mask(x, self.eod)}
        return x, y

    def labels(self):
        raise DataError("data: a token stream has no class labels; this feature needs (x, y) class data")

    def hash_into(self, h) -> None:
        self.stream.hash_into(h)
        h.update(f"{self.start}:{self.stop}:{self.seq_len}:{self.stride}:{self.eod}:{self.mask}".encode())


def _meta(folder: Path, required: bool) -> Optional[TokensMeta]:
    path = folder / SIDECAR
    if not path.exists():
        if required:
            raise DataError(f"data.name: {folder} holds no {SIDECAR}; give the .bin file itself (tokens:FILE.bin) "
                            "with data.kwargs.dtype and vocab_size, or write the folder with `ecotrain tokenize`")
        return None
    obj = read_json(path, "token files' description", fix=_FIX, error=DataError)
    meta = parse(TokensMeta, obj, str(path), DataError, strict=True)
    for split, claimed in meta.tokens.items():  # its counts give bits per byte: they must be the files'
        name = meta.files.get(split)
        if name is None or not (folder / name).is_file():
            continue  # a missing file is refused where it is read, in its own words
        held = TokenFile(_beside(folder, name, f"{split} file"), meta.dtype, where=f"{path} dtype").n
        if held != claimed:
            raise DataError(f"{path}: says the {split} file {name} holds {claimed:,} tokens, but it holds {held:,} "
                            f"{meta.dtype} ids; the description is not of these files: {_FIX}")
    return meta


def _beside(folder: Path, name: str, what: str) -> Path:
    """A file the sidecar names: a plain name in its own folder (never a path out of it)."""
    if Path(name).name != name or name in (".", ".."):
        raise DataError(f"{folder / SIDECAR}: the {what} '{name}' is not a file name in its folder; {_FIX}")
    return user_path(folder / name, f"{folder / SIDECAR} {what}", _FIX, error=DataError)


def _agreed(metas: dict[Path, TokensMeta]) -> Optional[TokensMeta]:
    """The one description the sidecars of a stream's folders agree on (dtype, vocabulary, eod,
    tokenizer), with their tokens and bytes summed; None without sidecars."""
    if not metas:
        return None
    (f0, m0), *rest = metas.items()
    for f, m in rest:
        for field, what in (("dtype", "dtypes"), ("vocab_size", "vocabularies"), ("eod", "end-of-document ids")):
            if getattr(m, field) != getattr(m0, field):
                raise DataError(f"data: shards with mismatched {what}: {f0 / SIDECAR} says {getattr(m0, field)}, "
                                f"{f / SIDECAR} {getattr(m, field)}; one stream is one tokenizer's ids in one dtype")
        if _tokenizer_bytes(f0, m0) != _tokenizer_bytes(f, m):
            raise DataError(f"data: shards tokenized with different tokenizers: {f0 / (m0.tokenizer or SIDECAR)} and "
                            f"{f / (m.tokenizer or SIDECAR)} differ; tokenize every shard with one (`ecotrain tokenize "
                            "--tokenizer-from`)")
    tokens = sum(sum(m.tokens.values()) for m in metas.values())
    byte_counts = [m.bytes for m in metas.values()]
    return m0.model_copy(update={"tokens": {"train": tokens},
                                 "bytes": sum(byte_counts) if None not in byte_counts else None})


def _tokenizer_bytes(folder: Path, meta: TokensMeta) -> Optional[bytes]:
    if not meta.tokenizer:
        return None
    try:
        return safefile.read_bytes(_beside(folder, meta.tokenizer, "tokenizer"), "tokenizer file", TOKENIZER_MAX_BYTES,
                                   fix=_FIX, error=DataError)
    except OSError as exc:
        raise DataError(f"{folder / meta.tokenizer}: cannot read the tokenizer ({exc.strerror})") from None


def _dtype(opts: TokensOptions, meta: Optional[TokensMeta]) -> Optional[str]:
    """data.kwargs.dtype, else tokens.json's (None: an llm.c header must say it)."""
    if opts.dtype and meta and opts.dtype != meta.dtype:
        raise DataError(f"data.kwargs.dtype: {opts.dtype}, but {SIDECAR} says the files hold {meta.dtype}; "
                        "drop data.kwargs.dtype")
    return opts.dtype or (meta.dtype if meta else None)


def _settings(opts: TokensOptions, meta: Optional[TokensMeta], hint: Optional[int]
              ) -> tuple[Optional[str], int, Optional[int]]:
    """(dtype or None for llm.c-headed files, vocab size, eod) from data.kwargs, else from tokens.json
    (else, for the vocabulary, what an llm.c header's tokenizer has: `hint`)."""
    dtype = _dtype(opts, meta)
    vocab = opts.vocab_size or (meta.vocab_size if meta else None) or hint
    if vocab is None:
        raise DataError(f"data.kwargs.vocab_size: required for token files without {SIDECAR} (nanoGPT's GPT-2 "
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


def _pattern_files(given: str, what: str) -> list[Path]:
    """A file, or a `shards:` pattern of .bin files (a glob, braces, a comma list, a folder)."""
    if not is_pattern(given):
        return [user_path(given, what, "give a .bin token file (or a pattern of them)", error=DataError)]
    files = expand(given, (".bin",))
    odd = next((f for f in files if f.suffix != ".bin"), None)
    if odd is not None:
        raise DataError(f"{what}: {odd} is not a .bin token file; the pattern must name .bin files only")
    return files


def _split_files(given: Optional[str], meta, folder: Path, split: str, own: bool) -> Optional[list[Path]]:
    """A split's own files: data.kwargs.<split>, else the sidecar's (when PATH is its folder or its train file)."""
    if given:
        return _pattern_files(given, f"data.kwargs.{split}")
    if own and meta and split in meta.files:
        return [_beside(folder, meta.files[split], f"{split} file")]
    return None


def _held_out(train: list[Path], splits: dict[str, Optional[list[Path]]], where: str) -> None:
    """No held-out split reads a file the model trains on (or another split's): test perplexity measured
    on trained tokens says nothing. One line naming the file and both uses."""
    used = {f.resolve(): "train" for f in train}
    for split, files in splits.items():
        for f in files or ():
            other = used.setdefault(f.resolve(), split)
            if other != split:
                raise DataError(f"{where}: {f} is both the {other} file and the {split} file; a held-out split must "
                                f"be text the model never trains on: name another file for {split} (or leave it out "
                                "for a slice of the stream)")


def _stream(paths: list[Path], dtype: Optional[str]) -> TokenStream:
    return TokenStream([TokenFile(p, dtype) for p in paths])


def load_tokens(cfg) -> DataBundle:
    """`tokens:PATH`: one .bin file, or a tokenized folder's files."""
    opts = parse(TokensOptions, dict(cfg.data.kwargs), "data.kwargs", DataError)
    path = cfg.data.name.partition(":")[2]
    if not path:
        raise DataError("data.name: 'tokens:' needs a path: tokens:FILE.bin, or tokens:FOLDER holding tokens.json")
    p = user_path(path, "data.name", "give a .bin token file, or a folder holding tokens.json", folder=True,
                  error=DataError)
    folder = p if p.is_dir() else p.parent
    if p.name == SIDECAR:  # its bytes would be read as ids (a vocabulary of 50,257 takes most pairs of ASCII)
        raise DataError(f"data.name: {p} is the description of the token files beside it, not one; give the folder: "
                        f"tokens:{folder}")
    meta = _meta(folder, required=p.is_dir())
    if p.is_dir():
        if "train" not in meta.files:
            raise DataError(f"{folder / SIDECAR}: names no train file; {_FIX}")
        p = _beside(folder, meta.files["train"], "train file")
    own = meta is not None and meta.files.get("train") == p.name  # the sidecar describes this file's splits
    first = TokenFile(p, _dtype(opts, meta))
    dtype, vocab, eod = _settings(opts, meta, first.vocab_hint)
    train = TokenStream([first])
    dtype = dtype or str(first.dtype)
    splits = {s: _split_files(getattr(opts, s), meta, folder, s, own) for s in ("val", "test")}
    _held_out([p], splits, f"data.name=tokens:{path}" + (f" ({folder / SIDECAR})" if own else ""))
    tokenizer = _beside(folder, meta.tokenizer, "tokenizer") if own and meta.tokenizer else None
    return _bundle(cfg, opts, train, {s: _stream(f, dtype) for s, f in splits.items() if f}, vocab, eod, tokenizer,
                   _bytes_per_token(opts, meta))


def load_token_shards(cfg) -> Optional[DataBundle]:
    """`shards:PATTERN` naming .bin token files: one stream (None when the pattern names no .bin file:
    tar or Parquet shards, data/shards.py)."""
    pattern = cfg.data.name.partition(":")[2]
    files = expand(pattern, (".bin",)) if pattern else []
    bins = [f for f in files if f.suffix == ".bin"]
    if not bins:
        return None
    if len(bins) != len(files):
        odd = next(f for f in files if f.suffix != ".bin")
        raise DataError(f"data.name=shards:{pattern}: {odd.name} is not a .bin token file among .bin token files; "
                        "one kind of shard per run")
    opts = parse(TokensOptions, dict(cfg.data.kwargs), "data.kwargs", DataError)
    folders = list(dict.fromkeys(f.resolve().parent for f in bins))
    metas = {d: m for d in folders if (m := _meta(d, required=False)) is not None}
    for f in bins:  # a sidecar's held-out file among the training shards: its split would be trained on
        named = metas[f.resolve().parent].files if f.resolve().parent in metas else {}
        split = next((s for s, n in named.items() if s != "train" and n == f.name), None)
        if split is not None:
            raise DataError(f"data.name=shards:{pattern}: {f.name} is the {split} file of {f.parent / SIDECAR}; "
                            "a training shard would train on the held-out text: name the train files (e.g. */train.bin)")
    meta = _agreed(metas)
    train = TokenStream([TokenFile(f, _dtype(opts, meta)) for f in bins])  # one dtype, or one line
    hints = {f.vocab_hint for f in train.files}
    dtype, vocab, eod = _settings(opts, meta, next(iter(hints)) if len(hints) == 1 else None)
    dtype = dtype or str(train.files[0].dtype)  # llm.c headers: the split files read as the train files
    held = {s: _pattern_files(getattr(opts, s), f"data.kwargs.{s}") for s in ("val", "test") if getattr(opts, s)}
    _held_out(bins, held, f"data.name=shards:{pattern}")
    splits = {s: _stream(f, dtype) for s, f in held.items()}
    tokenizer = None
    if meta is not None and meta.tokenizer:
        d0 = next(iter(metas))
        tokenizer = _beside(d0, metas[d0].tokenizer, "tokenizer")
    return _bundle(cfg, opts, train, splits, vocab, eod, tokenizer, _bytes_per_token(opts, meta))


def _bytes_per_token(opts: TokensOptions, meta: Optional[TokensMeta]) -> Optional[float]:
    if opts.bytes_per_token is not None:
        return float(opts.bytes_per_token)
    tokens = sum(meta.tokens.values()) if meta is not None else 0
    if meta is None or not meta.bytes or not tokens:
        return None
    per = meta.bytes / tokens
    if per > MAX_BYTES_PER_TOKEN:
        raise DataError(f"{SIDECAR}: bytes {meta.bytes:,} over {tokens:,} tokens is {per:.3g} bytes a token, more "
                        f"than any tokenizer's {MAX_BYTES_PER_TOKEN:,}; {_FIX} (or set data.kwargs.bytes_per_token)")
    return per


def _bundle(cfg, opts: TokensOptions, train_stream: TokenStream, own: dict[str, TokenStream], vocab: int,
            eod: Optional[int], tokenizer: Optional[Path], bytes_per_token: Optional[float]) -> DataBundle:
    """The splits: `own` val/test streams, else the train stream's tail; every id checked."""
    for stream in (train_stream, *own.values()):
        stream.check_ids(vocab)
    # splits the stream gives: its tail, test last, cut at token positions (windows never straddle)
    n = train_stream.n
    n_test = round(n * cfg.data.test_split) if "test" not in own else 0
    n_val = round(n * cfg.data.val_split) if "val" not in own else 0
    cut_val, cut_test = n - n_test - n_val, n - n_test
    train = TokenSource(train_stream, 0, cut_val, opts, vocab, eod)
    val = (TokenSource(own["val"], 0, own["val"].n, opts, vocab, eod) if "val" in own else
           TokenSource(train_stream, cut_val, cut_test, opts, vocab, eod) if n_val else None)
    test = (TokenSource(own["test"], 0, own["test"].n, opts, vocab, eod) if "test" in own else
            TokenSource(train_stream, cut_test, n, opts, vocab, eod) if n_test else None)
    for name, src in (("train", train), ("validation", val), ("test", test)):
        if src is not None and len(src) == 0:
            tokens = src.stop - src.start
            raise DataError(f"data: the {name} split holds {tokens:,} tokens, too few for one window of seq_len + 1 = "
                            f"{opts.seq_len + 1}; lower data.kwargs.seq_len, or give more tokens "
                            f"({'a larger split fraction or ' if src.stream is train_stream and name != 'train' else ''}"
                            "a longer file)")
    extra = {"task": "lm", "tokens": {k: s.stop - s.start for k, s in (("train", train), ("val", val), ("test", test))
                                      if s is not None}}
    if tokenizer is not None:
        extra["tokenizer"] = str(tokenizer)
    if bytes_per_token is not None:
        extra["bytes_per_token"] = bytes_per_token
    return DataBundle(train, val, test, vocab, (opts.seq_len,), extra=extra, sample=train.take(torch.tensor([0])))
