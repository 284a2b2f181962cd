"""A language model through `export` and `predict`: the windows its parity check runs (token ids
alone, at the test split's length, then at other lengths and batch sizes), and its tokenizer (the
run's own, carried inside the exported file so that `predict MODEL.pt2 --prompt` needs nothing else).

The exported program takes `input_ids` alone, causal attention over the whole window: a prompt is one
document, so a packed run's document mask (a training-time input) is left out of the program, and the
parity check runs eager and exported on the same ids without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from ecotrain.data.sources import ArraySource
from ecotrain.data.tokenizer import TOKENIZER_FILE, ByteTokenizer, load_tokenizer, parse_tokenizer, read_tokenizer
from ecotrain.base.errors import ConfigError

CHECK_ROWS = 8  # rows of the test split checked again at each other length, in batches of 3 (3, 3, 2)
CHECK_BATCH = 3


class Windows:
    """An LM split as `(input_ids, targets)`, cut to the first `length` positions and `rows` rows."""

    def __init__(self, source, task, length: Optional[int] = None, rows: Optional[int] = None):
        self.source, self.task, self.length = source, task, length
        self.rows = len(source) if rows is None else min(rows, len(source))

    def __len__(self) -> int:
        return self.rows

    def take(self, idx):
        batch = self.source.take(idx)
        args, kwargs = self.task.inputs(batch)
        ids = args[0] if args else (kwargs or {}).get("input_ids")
        if not isinstance(ids, torch.Tensor):
            raise ConfigError("export: a language model's batches hold no token ids (a tensor by position, or "
                              "`input_ids`); export the model from Python with torch.export.export")
        y = self.task.targets(batch)
        if self.length is not None:
            ids, y = ids[:, :self.length], y[:, :self.length]
        return ids.clone(), y.clone()


def parity_sources(windows: Windows, max_len: Optional[int], vocab: int) -> list[tuple[int, object]]:
    """[(length, source)] checked beside the test split's own windows (length T): the first rows cut to
    about half of T and to one token (the shortest prompt), in batches of another size; and, when the
    model takes more than the data's windows, `max_len` seeded random ids (no split is that long)."""
    x, _ = windows.take(torch.arange(min(1, len(windows))))
    t = x.shape[1]
    out = [(n, Windows(windows.source, windows.task, n, CHECK_ROWS)) for n in sorted({(t + 1) // 2, 1}) if n < t]
    if max_len is not None and max_len > t:
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(vocab, (2, max_len + 1), generator=g)
        out.append((max_len, ArraySource(ids[:, :-1].contiguous(), ids[:, 1:].contiguous())))
    return out


def run_tokenizer(run_dir: Path, data_name: str, given: Optional[str] = None):
    """(tokenizer, its tokenizer.json text) of a run: `given` (--tokenizer), else RUN/tokenizer.json (what
    the run's data came with), else bytes for the built-in `text` source; (None, None) when nothing says."""
    if given is not None:
        return read_tokenizer(given)
    own = Path(run_dir) / TOKENIZER_FILE
    if own.exists():  # a FIFO or a folder there: read_tokenizer's one line, not "the run has no tokenizer"
        return read_tokenizer(own)
    if data_name == "text":  # byte ids 0..255, no end-of-document id in the model's 256
        tok = ByteTokenizer()
        return tok, tok.to_json()
    return None, None


def carried_tokenizer(extra: dict, where, given: Optional[str] = None):
    """The tokenizer an exported file carries (`given`, --tokenizer, first), or None."""
    if given is not None:
        return load_tokenizer(given)
    text = extra.get(TOKENIZER_FILE)
    return parse_tokenizer(text, f"{where} (its tokenizer.json)") if text else None
