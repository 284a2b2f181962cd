"""Tokenizers trained on the user's own corpus, never downloaded.

`bpe`: a byte-level BPE of the `tokenizers` library (the `lm` extra), trained locally to a given
vocabulary size; any text round-trips, as GPT-2's does. `bytes`: the 256 byte values plus an
end-of-document id (256), what the built-in `text` source reads; the fallback when `tokenizers` is
not installed. Both are saved as `tokenizer.json`: the library's own file, or a small
`{"ecotrain_tokenizer": "bytes", ...}` object for bytes; `load_tokenizer` reads either, and a run
keeps a copy in its folder (RUN/tokenizer.json) so predict and export can encode prompts later.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Optional

from ecotrain.base import safefile
from ecotrain.base.objects import describe
from ecotrain.base.errors import ConfigError, DataError
from ecotrain.base.log import log
from ecotrain.base.rundir import atomic_write
from ecotrain.base.runfiles import TOKENIZER, TOKENIZER_MAX_BYTES

EOD_TEXT = "<|endoftext|>"  # the end-of-document token, GPT-2's spelling
TOKENIZER_FILE = TOKENIZER  # in a tokenized folder and in a run folder
MIN_BPE_VOCAB = 257  # the 256 byte symbols and the end-of-document token
MAX_BPE_VOCAB = 1 << 22  # far beyond any merge table a corpus trained here makes; refuses a typo's 10**12
_FIX = "give the tokenizer.json its tokens were made with (ecotrain tokenize writes one)"


class ByteTokenizer:
    kind = "bytes"
    vocab_size = 257
    eod = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def to_json(self) -> str:
        return json.dumps({"ecotrain_tokenizer": "bytes", "vocab_size": self.vocab_size, "eod": self.eod})


class BPETokenizer:
    kind = "bpe"

    def __init__(self, tok, where: str = "tokenizer"):
        self.tok, self.where = tok, where
        ids = tok.get_vocab(with_added_tokens=True).values()
        # the ids it can give, not the size it states: an added token may sit past get_vocab_size() (a
        # uint16 file would wrap it round to another token)
        self.vocab_size = max(tok.get_vocab_size(with_added_tokens=True), max(ids, default=-1) + 1)
        self.eod = tok.token_to_id(EOD_TEXT)

    def encode(self, text: str) -> list[int]:
        try:
            return self.tok.encode(text).ids
        except Exception as exc:  # the library's refusal, e.g. a WordLevel model with no unknown token
            raise DataError(f"{self.where}: cannot encode the text ({describe(exc)}); a tokenizer must encode "
                            "any text (a WordLevel or WordPiece model needs its unknown token in the vocabulary)") from None

    def decode(self, ids: Iterable[int]) -> str:
        return self.tok.decode(list(ids))

    def to_json(self) -> str:
        return self.tok.to_str()


def _tokenizers():
    try:
        import tokenizers  # optional: the `lm` extra (a dependency of transformers too)
    except ImportError:
        return None
    return tokenizers


def train_bpe(documents: Iterable[str], vocab_size: int) -> BPETokenizer:
    """A byte-level BPE of `vocab_size` ids (end-of-document first), trained on `documents`."""
    if not MIN_BPE_VOCAB <= vocab_size <= MAX_BPE_VOCAB:
        raise ConfigError(f"--vocab-size: {vocab_size:,} is outside {MIN_BPE_VOCAB} (the 256 bytes and the "
                          f"end-of-document token) to {MAX_BPE_VOCAB:,}")
    tk = _tokenizers()
    if tk is None:
        raise ConfigError("tokenize: the BPE tokenizer needs the tokenizers library: pip install 'ecotrain[lm]' "
                          "(or --tokenizer bytes)")
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOD_TEXT], show_progress=False,
                                     initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(documents, trainer)
    return BPETokenizer(tok)


def make_tokenizer(kind: str, documents: Iterable[str], vocab_size: int):
    """`kind` bpe (trained on `documents`) or bytes; bpe falls back to bytes, with a warning, when the
    tokenizers library is missing."""
    if kind == "bpe" and _tokenizers() is None:
        log.warning("tokenize: the tokenizers library is not installed (pip install 'ecotrain[lm]'); "
                    "using the byte-level tokenizer (257 ids)")
        kind = "bytes"
    return ByteTokenizer() if kind == "bytes" else train_bpe(documents, vocab_size)


def _file(path) -> Path:
    path = Path(path)
    return path / TOKENIZER_FILE if path.is_dir() else path


def tokenizer_text(path) -> str:
    """A saved tokenizer.json's text (`path`: the file, or a folder holding one: a run or a tokenized
    folder), read through safefile: a FIFO, a device or a file above TOKENIZER_MAX_BYTES is one DataError
    line, never a wait (the tokenizers library is handed the text, never the path)."""
    path = _file(path)
    try:
        return safefile.read_text(path, "tokenizer file", TOKENIZER_MAX_BYTES, fix=_FIX, error=DataError)
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        raise DataError(f"{path}: not a readable tokenizer file ({getattr(exc, 'strerror', None) or exc})") from None


def read_tokenizer(path) -> tuple[ByteTokenizer | BPETokenizer, str]:
    """(tokenizer, the text it was parsed from) of a saved tokenizer.json, read once."""
    path = _file(path)
    text = tokenizer_text(path)
    return parse_tokenizer(text, path), text


def load_tokenizer(path) -> ByteTokenizer | BPETokenizer:
    """A saved tokenizer.json (a file, or a folder holding one: a run or a tokenized folder)."""
    return read_tokenizer(path)[0]


def parse_tokenizer(text: str, where) -> ByteTokenizer | BPETokenizer:
    """A tokenizer.json's text (a file's, or one an exported model carries); `where` names it in errors."""
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise DataError(f"{where}: not a readable tokenizer file ({exc})") from None
    except RecursionError:  # [[[[... 100,000 deep
        raise DataError(f"{where}: not a readable tokenizer file (JSON nested too deep to read)") from None
    if isinstance(obj, dict) and obj.get("ecotrain_tokenizer") == "bytes":
        return ByteTokenizer()
    tk = _tokenizers()
    if tk is None:
        raise ConfigError(f"{where}: a BPE tokenizer needs the tokenizers library: pip install 'ecotrain[lm]'")
    try:
        tok = BPETokenizer(tk.Tokenizer.from_str(text), str(where))
    except Exception as exc:  # the library's own parse error, whatever its type
        raise DataError(f"{where}: not a tokenizers tokenizer ({type(exc).__name__}: {str(exc)[:200]})") from None
    return tok


def save_tokenizer(run_dir: Path, source: Optional[str]) -> None:
    """The data's tokenizer copied into the run folder (RUN/tokenizer.json), where predict finds it."""
    if source:
        try:
            data = safefile.read_bytes(source, "tokenizer file", TOKENIZER_MAX_BYTES, fix=_FIX, error=DataError)
        except OSError as exc:
            raise DataError(f"{source}: not a readable tokenizer file ({exc.strerror or exc})") from None
        atomic_write(Path(run_dir) / TOKENIZER_FILE, data)
