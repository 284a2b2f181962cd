"""The body of `ecotrain tokenize CORPUS --out DIR [--vocab-size N] [--tokenizer bpe|bytes]`: a text
corpus into token files for `data.name: tokens:DIR` (data/corpus.py; docs/data.md)."""

from __future__ import annotations

import time

from ecotrain.data.corpus import tokenize_corpus
from ecotrain.base.rundir import file_in_the_way
from ecotrain.base.errors import DataError


def cmd_tokenize(args, ctx) -> int:
    blocked = file_in_the_way(args.out)
    if blocked is not None:
        raise DataError(f"--out {args.out}: {blocked} is a file, so no folder can be made under it; choose another path")
    t = time.perf_counter()
    meta = tokenize_corpus(args.corpus, args.out, args.vocab_size, args.tokenizer, args.val_share, args.test_share,
                           args.tokenizer_from)
    ctx.committed()
    counts = ", ".join(f"{s} {meta.tokens[s]:,} tokens ({meta.documents[s]:,} documents)" for s in meta.files)
    per = f", {meta.bytes / sum(meta.tokens.values()):.2f} bytes a token" if meta.bytes else ""
    origin = f" (the tokenizer of {args.tokenizer_from})" if args.tokenizer_from else ""
    print(f"{args.out}: {counts}; vocabulary {meta.vocab_size:,} ({meta.dtype}){origin}{per}, end of document {meta.eod} "
          f"({time.perf_counter() - t:.1f} s); train with data.name=tokens:{args.out}")
    return 0
