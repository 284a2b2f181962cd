"""`ecotrain tokenize CORPUS --out DIR [--vocab-size N] [--tokenizer bpe|bytes]`: a text corpus into token
files for `data.name: tokens:DIR` (data/corpus.py; docs/data.md)."""

from __future__ import annotations

NAME = "tokenize"
HELP = ("a text corpus into token files (train/val .bin, tokenizer.json, tokens.json) for "
        "data.name=tokens:DIR")
TRAINS = False


def arguments(tk) -> None:
    tk.add_argument("corpus", help="a text file (one document), a .jsonl file (a \"text\" per line) or a folder of them")
    tk.add_argument("--out", required=True, help="folder for the token files")
    tk.add_argument("--vocab-size", type=int, default=4096, help="BPE vocabulary size (default 4096)")
    tk.add_argument("--tokenizer", choices=["bpe", "bytes"], default="bpe", help="bpe: byte-level BPE trained on the "
                    "corpus (tokenizers library); bytes: the 256 byte values and end of document (default bpe)")
    tk.add_argument("--tokenizer-from", metavar="PATH", help="encode with this saved tokenizer instead of training "
                    "one: a tokenizer.json, or a run, registry version or tokenized folder holding one (the ids of "
                    "a model trained on another corpus, for `ecotrain update`)")
    tk.add_argument("--val-share", type=float, default=0.1, help="share of the documents for val.bin (default 0.1)")
    tk.add_argument("--test-share", type=float, default=0.0, help="share of the documents for test.bin (default 0)")


def run(args, ctx) -> int:
    import time

    from ecotrain.base.errors import DataError
    from ecotrain.base.rundir import file_in_the_way
    from ecotrain.data.corpus import tokenize_corpus

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
