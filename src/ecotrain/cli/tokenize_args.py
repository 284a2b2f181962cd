"""`ecotrain tokenize CORPUS --out DIR`'s arguments. Argparse only, no tokenizers or torch: imported to
parse the command (ecotrain/cli/commands.py lists the commands); the body is cli/corpus.py (data/corpus.py),
imported when it runs."""

from __future__ import annotations


def tokenize(tk) -> None:
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
