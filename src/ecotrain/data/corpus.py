"""A text corpus into token files: `ecotrain tokenize CORPUS --out DIR` (and `tokenize_corpus`).

CORPUS is a text file (one document), a `.jsonl` file (one document per line, its "text"), or a
folder of such files (sorted by path; names starting with a dot left out). The tokenizer is trained
on the training documents only, then every document is written as its ids followed by the
end-of-document id. The last `val_share` (and `test_share`) of the documents go to val.bin
(test.bin); a corpus of one document has its token stream cut instead.

Writing is atomic: every file goes to a temporary folder inside DIR first; the old tokens.json is
removed before the files move in and the new one is written last, so DIR never holds a tokens.json
that describes other files.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Iterator

import numpy as np

from ecotrain.base import safefile
from ecotrain.config.tokens import SIDECAR, TokensMeta
from ecotrain.data.tokenizer import EOD_TEXT, TOKENIZER_FILE, load_tokenizer, make_tokenizer
from ecotrain.base.errors import DataError
from ecotrain.base.filelock import try_lock_folder, unlock
from ecotrain.base.rundir import atomic_write, fsync_dir
from ecotrain.base.userpath import user_path

MAX_DOCUMENT_BYTES = 1 << 30  # one document read whole: a 1 GiB line is a damaged file, not text
_WRITE_IDS = 1 << 20  # ids buffered before a write


def corpus_files(corpus: Path) -> list[Path]:
    p = user_path(corpus, "tokenize", "give a text file, a .jsonl file or a folder of them", folder=True,
                  error=DataError)
    if p.is_file():
        return [p]
    files = sorted(f for f in p.rglob("*") if f.is_file() and not any(part.startswith(".") for part in
                                                                         f.relative_to(p).parts))
    if not files:
        raise DataError(f"tokenize: {p} holds no files; give a folder of text or .jsonl files")
    return files


def _not_token_files(corpus: Path, out: Path, files: list[Path]) -> None:
    """A corpus folder holding tokenize's own output (--out inside it, or a tokenized folder moved
    there) would read its .bin ids and tokenizer.json as documents, silently: refused in one line."""
    if corpus.is_dir():
        c, o = corpus.resolve(), out.resolve()
        if o == c or c in o.parents:
            raise DataError(f"tokenize: --out {out} is inside the corpus {corpus}: the next run would read its token "
                            "files as text; put --out outside the corpus")
    sidecar = next((f for f in files if f.name == SIDECAR), None)
    if sidecar is not None:
        raise DataError(f"tokenize: {sidecar} is in the corpus: a tokenized folder's .bin ids and tokenizer.json are "
                        f"not text; move {sidecar.parent} out of {corpus}")


def _text(data: bytes, path: Path, where: str = "") -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}{where}: not UTF-8 text (byte {exc.start}); save the corpus as UTF-8") from None


def documents(files: list[Path]) -> Iterator[str]:
    """Each document's text, in order."""
    for path in files:
        if path.suffix != ".jsonl":
            if path.stat().st_size > MAX_DOCUMENT_BYTES:
                raise DataError(f"{path}: {path.stat().st_size:,} bytes in one document, over "
                                f"{MAX_DOCUMENT_BYTES:,}; split it into files or a .jsonl")
            yield _text(safefile.read_bytes(path, "document", MAX_DOCUMENT_BYTES, error=DataError,
                                            fix="split it into files or a .jsonl"), path)
            continue
        with safefile.open_regular(path, "JSON lines file", error=DataError) as f:
            for i, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(_text(line, path, f":{i}"))
                except ValueError as exc:
                    raise DataError(f"{path}:{i}: not a JSON line ({exc})") from None
                text = obj.get("text") if isinstance(obj, dict) else None
                if not isinstance(text, str):
                    raise DataError(f"{path}:{i}: a .jsonl line must be an object with a \"text\" string")
                yield text


def _shares(n_docs: int, val_share: float, test_share: float) -> tuple[int, int]:
    """(validation documents, test documents): the corpus's last ones, at least one each when asked."""
    n_val = max(1, round(n_docs * val_share)) if val_share > 0 else 0
    n_test = max(1, round(n_docs * test_share)) if test_share > 0 else 0
    return n_val, n_test


class _Writer:
    """Ids appended to one split's file, buffered."""

    def __init__(self, path: Path, dtype):
        self.path, self.dtype, self.f, self.buf, self.n, self.docs = path, dtype, open(path, "wb"), [], 0, 0

    def add(self, ids: list[int]) -> None:
        self.buf += ids
        self.n += len(ids)
        if len(self.buf) >= _WRITE_IDS:
            self.flush()

    def flush(self) -> None:
        np.asarray(self.buf, dtype=self.dtype).tofile(self.f)
        self.buf = []

    def close(self) -> None:
        self.flush()
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()


DEFAULT_VOCAB = 4096  # ecotrain tokenize --vocab-size's default


def tokenize_corpus(corpus, out, vocab_size: int = DEFAULT_VOCAB, tokenizer: str = "bpe", val_share: float = 0.1,
                    test_share: float = 0.0, tokenizer_from=None) -> TokensMeta:
    """Train a tokenizer on `corpus` (or take the one saved at `tokenizer_from`: a tokenizer.json, or a
    run, version or tokenized folder holding one) and write OUT/{train,val,test}.bin, tokenizer.json
    and tokens.json (with `bytes`, the UTF-8 bytes of every document: bits per byte)."""
    for name, share in (("--val-share", val_share), ("--test-share", test_share)):
        if not 0 <= share < 1:
            raise DataError(f"tokenize: {name} {share} must be at least 0 and below 1")
    if val_share + test_share >= 1:
        raise DataError(f"tokenize: --val-share {val_share} and --test-share {test_share} leave no training text")
    if tokenizer_from is not None:  # the saved tokenizer is taken whole: nothing of it is chosen here
        if not str(tokenizer_from).strip():
            raise DataError("tokenize: --tokenizer-from is empty; give a tokenizer.json, or a run, version or "
                            "tokenized folder holding one")
        if tokenizer != "bpe" or vocab_size != DEFAULT_VOCAB:
            given = f"--tokenizer {tokenizer}" if tokenizer != "bpe" else f"--vocab-size {vocab_size}"
            raise DataError(f"tokenize: {given} with --tokenizer-from {tokenizer_from}: the saved tokenizer decides "
                            "the ids and the vocabulary; drop one of them")
    if not str(out).strip():  # Path("") is the current folder: its files would be written there, unasked
        raise DataError("tokenize: --out is empty; give the folder for the token files (. for this one)")
    files = corpus_files(Path(corpus))
    _not_token_files(Path(corpus), Path(out), files)
    n_docs = sum(1 for _ in documents(files))  # a first pass: the split needs the count
    if n_docs == 0:
        raise DataError(f"tokenize: {corpus} holds no documents")
    n_val, n_test = _shares(n_docs, val_share, test_share) if n_docs > 1 else (0, 0)
    if n_docs > 1 and n_val + n_test >= n_docs:
        raise DataError(f"tokenize: {n_docs} documents are too few for the validation and test shares; "
                        "give more documents or smaller --val-share/--test-share")
    n_train = n_docs - n_val - n_test
    if tokenizer_from is not None:  # another corpus's tokenizer: the same ids for the same text
        tok = load_tokenizer(user_path(tokenizer_from, "--tokenizer-from", "give a tokenizer.json, or a run, "
                                       "version or tokenized folder holding one", folder=True, error=DataError))
    else:
        train_docs = (d for i, d in enumerate(documents(files)) if i < n_train)
        tok = make_tokenizer(tokenizer, train_docs, vocab_size)
    if tok.eod is None:  # documents are written with it between them; without it they would run together
        raise DataError(f"tokenize: --tokenizer-from {tokenizer_from}: the tokenizer has no end-of-document token "
                        f"'{EOD_TEXT}', which ends each document in the token files; add it as a special token, or "
                        "let tokenize train one (leave out --tokenizer-from)")
    dtype = np.uint16 if tok.vocab_size <= 1 << 16 else np.uint32
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"tokenize: --out {out}: cannot create the folder ({exc.strerror})") from None
    held = try_lock_folder(out)  # one tokenize per folder: two racing would mix their files
    if held is None:
        raise DataError(f"tokenize: --out {out}: another tokenize is writing this folder; wait for it to finish, "
                        "or choose another --out")
    try:
        return _write(out, files, tok, dtype, n_docs, n_train, n_val, n_test, val_share, test_share)
    finally:
        unlock(held)


def _write(out: Path, files, tok, dtype, n_docs: int, n_train: int, n_val: int, n_test: int, val_share: float,
           test_share: float) -> TokensMeta:
    """The token files, written under OUT/.tokenize-PID and renamed into place, the sidecar last. The
    folder is held (tokenize_corpus), so a .tokenize-* folder another process left is a killed
    tokenize's: removed first. The hold is a flock, one host's: two hosts writing one --out on a shared
    file system are not kept apart."""
    for stale in out.glob(".tokenize-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = out / f".tokenize-{os.getpid()}"
    tmp.mkdir()
    try:
        splits = ["train"] + (["val"] if n_val or (n_docs == 1 and val_share) else []) + \
                 (["test"] if n_test or (n_docs == 1 and test_share) else [])
        writers = {s: _Writer(tmp / f"{s}.bin", dtype) for s in splits}
        n_bytes = 0
        for i, text in enumerate(documents(files)):
            split = "train" if i < n_train else "val" if i < n_train + n_val else "test"
            n_bytes += len(text.encode("utf-8"))
            writers[split].add(tok.encode(text) + [tok.eod])
            writers[split].docs += 1
        for w in writers.values():
            w.close()
        if n_docs == 1 and len(splits) > 1:
            _cut_one_document(tmp, writers, dtype, val_share, test_share)
        meta = TokensMeta(dtype=np.dtype(dtype).name, vocab_size=tok.vocab_size, eod=tok.eod, tokenizer=TOKENIZER_FILE,
                          files={s: f"{s}.bin" for s in splits}, tokens={s: w.n for s, w in writers.items()},
                          documents={s: w.docs for s, w in writers.items()}, bytes=n_bytes)
        empty = [s for s, w in writers.items() if w.n == 0]
        if empty:
            raise DataError(f"tokenize: the {empty[0]} split would hold no tokens; give more text")
        (tmp / TOKENIZER_FILE).write_text(tok.to_json(), encoding="utf-8")
        (out / SIDECAR).unlink(missing_ok=True)  # from here until the end, DIR describes nothing
        fsync_dir(out)
        for f in [*(f"{s}.bin" for s in splits), TOKENIZER_FILE]:
            os.replace(tmp / f, out / f)
        atomic_write(out / SIDECAR, (meta.model_dump_json(indent=2) + "\n").encode())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return meta


def _cut_one_document(tmp: Path, writers: dict, dtype, val_share: float, test_share: float) -> None:
    """One document: its stream (all in train.bin so far) cut into the splits by position."""
    ids = np.fromfile(safefile.regular(tmp / "train.bin", "token stream", error=DataError), dtype=dtype)
    n = len(ids)
    n_test = round(n * test_share) if "test" in writers else 0
    n_val = round(n * val_share) if "val" in writers else 0
    parts = {"train": ids[:n - n_val - n_test], "val": ids[n - n_val - n_test:n - n_test], "test": ids[n - n_test:]}
    for s, w in writers.items():
        parts[s].tofile(tmp / f"{s}.bin")
        w.n, w.docs = len(parts[s]), 1 if s == "train" else 0
