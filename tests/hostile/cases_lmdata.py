"""The hostile corpus, language-model data: token files (`data.name: tokens:PATH`, data/tokens.py) that
are empty, truncated, of another dtype, hold ids past the vocabulary, or come with a damaged or
escaping tokens.json; huge sizes in the options; `ecotrain tokenize` on corpora that are empty, not
UTF-8 or bad JSON lines; a recipe Dataset of dicts whose items disagree or hold bad targets. Each is
one line, exit 2, before anything trains. The harness is in cases.py."""

from __future__ import annotations

import json

import numpy as np

from tests.hostile.cases import FIT, NO_RUN, RUN, Case, both, write

CASES: list[Case] = []


def ids(values, dtype="uint16") -> bytes:
    return np.asarray(values, dtype=dtype).tobytes()


GOOD = np.arange(400) % 50
TOK = ["data.name=tokens:{tmp}/t/train.bin", "data.kwargs.seq_len=8"]
KNOWN = [*TOK, "data.kwargs.dtype=uint16", "data.kwargs.vocab_size=50"]


def refused(id: str, words, setup, *extra: str) -> Case:
    return Case(id, [*FIT, *extra, *RUN], 2, words, setup, absent=NO_RUN)


def sidecar(obj) -> object:
    return both(write("t/train.bin", ids(GOOD)), write("t/tokens.json", json.dumps(obj) if not isinstance(obj, str) else obj))


BAD_ID = GOOD.copy()
BAD_ID[123] = 51
CASES += [
    refused("tokens_empty_file", ["train.bin", "an empty token file (0 bytes)"], write("t/train.bin", b""), *KNOWN),
    refused("tokens_truncated_mid_id", ["train.bin", "801 bytes is not a whole number of uint16 ids"],
            write("t/train.bin", ids(GOOD) + b"\x01"), *KNOWN),
    refused("tokens_id_past_the_vocabulary", ["train.bin", "token id 51 at position 123", "vocabulary size 50"],
            write("t/train.bin", ids(BAD_ID)), *KNOWN),
    # uint16 ids read as uint32: pairs of ids make ids in the millions, caught by the vocabulary check
    refused("tokens_read_with_the_wrong_dtype", ["token id 65,536 at position 0", "data.kwargs.dtype"],
            write("t/train.bin", ids([0, 1] * 200)), *TOK, "data.kwargs.dtype=uint32", "data.kwargs.vocab_size=50"),
    refused("tokens_no_dtype", ["data.kwargs.dtype: required", "tokens.json"], write("t/train.bin", ids(GOOD)), *TOK),
    refused("tokens_float_dtype", ["data.kwargs.dtype", "'uint16' or 'uint32'"], write("t/train.bin", ids(GOOD)),
            *TOK, "data.kwargs.dtype=float32", "data.kwargs.vocab_size=50"),
    refused("tokens_unknown_option", ["data.kwargs.sqe_len: not an option"], write("t/train.bin", ids(GOOD)),
            *KNOWN, "data.kwargs.sqe_len=8"),
    refused("tokens_huge_vocab", ["data.kwargs.vocab_size", "4294967296"], write("t/train.bin", ids(GOOD)),
            *TOK, "data.kwargs.dtype=uint16", "data.kwargs.vocab_size=1000000000000"),
    refused("tokens_huge_seq_len", ["data.kwargs.seq_len", "1048576"], write("t/train.bin", ids(GOOD)),
            *KNOWN, "data.kwargs.seq_len=1000000000"),
    refused("tokens_window_longer_than_the_split", ["validation split holds 40 tokens", "seq_len + 1 = 65"],
            write("t/train.bin", ids(GOOD)), *KNOWN, "data.kwargs.seq_len=64"),
    refused("tokens_eod_past_the_vocabulary", ["data.kwargs.eod: 50 is not below the vocabulary size 50"],
            write("t/train.bin", ids(GOOD)), *KNOWN, "data.kwargs.eod=50"),
    refused("tokens_document_attention_without_eod", ["attention: document needs the end-of-document id"],
            write("t/train.bin", ids(GOOD)), *KNOWN, "data.kwargs.attention=document"),
    refused("tokens_sidecar_not_json", ["tokens.json: not readable JSON"], sidecar("{dtype: uint16"),
            "data.name=tokens:{tmp}/t"),
    refused("tokens_sidecar_wrong_dtype", ["tokens.json.dtype", "'uint16' or 'uint32'"],
            sidecar({"dtype": "float64", "vocab_size": 50, "files": {"train": "train.bin"}}), "data.name=tokens:{tmp}/t"),
    refused("tokens_sidecar_names_a_file_outside", ["'../../etc/passwd' is not a file name in its folder"],
            sidecar({"dtype": "uint16", "vocab_size": 50, "files": {"train": "../../etc/passwd"}}),
            "data.name=tokens:{tmp}/t"),
    refused("tokens_sidecar_names_a_missing_file", ["val file", "val.bin not found"],
            sidecar({"dtype": "uint16", "vocab_size": 50, "files": {"train": "train.bin", "val": "val.bin"}}),
            "data.name=tokens:{tmp}/t"),
    # its token and byte counts give bits per byte: a count the files do not hold is refused, not reported
    refused("tokens_sidecar_negative_count", ["tokens.json.tokens.train", "greater than or equal to 0"],
            sidecar({"dtype": "uint16", "vocab_size": 50, "files": {"train": "train.bin"}, "tokens": {"train": -400},
                     "bytes": 900}), "data.name=tokens:{tmp}/t"),
    refused("tokens_sidecar_count_is_not_the_files", ["tokens.json", "says the train file train.bin holds 1 tokens",
                                                      "but it holds 400 uint16 ids"],
            sidecar({"dtype": "uint16", "vocab_size": 50, "files": {"train": "train.bin"}, "tokens": {"train": 1},
                     "bytes": 900}), "data.name=tokens:{tmp}/t"),
    refused("tokens_sidecar_huge_bytes", ["tokens.json: bytes 10,000,000,000,000,000,000,000,000,000 over 400 tokens",
                                          "data.kwargs.bytes_per_token"],
            sidecar({"dtype": "uint16", "vocab_size": 50, "files": {"train": "train.bin"}, "tokens": {"train": 400},
                     "bytes": 10 ** 28}), "data.name=tokens:{tmp}/t"),
    refused("tokens_sidecar_eod_true", ["tokens.json.eod", "valid integer (got True)"],  # not id 1, silently
            sidecar({"dtype": "uint16", "vocab_size": 50, "eod": True, "files": {"train": "train.bin"}}),
            "data.name=tokens:{tmp}/t"),
    refused("tokens_the_sidecar_given_as_the_file", ["tokens.json is the description of the token files",
                                                     "give the folder: tokens:"],
            sidecar({"dtype": "uint16", "vocab_size": 50257, "files": {"train": "train.bin"}, "tokens": {"train": 400}}),
            "data.name=tokens:{tmp}/t/tokens.json"),
    refused("tokens_folder_without_sidecar", ["holds no tokens.json"], write("t/train.bin", ids(GOOD)),
            "data.name=tokens:{tmp}/t"),
    refused("tokens_fifo_is_not_read", ["data.name", "is a FIFO"], lambda tmp: __import__("os").mkfifo(tmp / "f.bin"),
            "data.name=tokens:{tmp}/f.bin", "data.kwargs.dtype=uint16", "data.kwargs.vocab_size=50"),
]



def _stdlib_bytes() -> int:
    from ecotrain.data.text import stdlib_files

    return sum(f.stat().st_size for f in stdlib_files())


# `text` shifted past most of the stdlib: the advice is the offset, not max_bytes (there are no more bytes)
CASES += [
    Case("text_offset_leaves_too_little", [*FIT, "data.name=text", "data.kwargs.seq_len=16",
                                           f"data.kwargs.offset={_stdlib_bytes() - 30}", *RUN], 2,
         ["too few for the splits", "lower the offset"], absent=NO_RUN),
]

# ecotrain tokenize: nothing is written into --out but what it already held
TOKENIZE = ["tokenize", "{tmp}/c", "--out", "{tmp}/out", "--tokenizer", "bytes"]
CASES += [
    Case("tokenize_empty_folder", TOKENIZE, 2, ["holds no files"], lambda tmp: (tmp / "c").mkdir(), absent=("out",)),
    Case("tokenize_not_utf8", TOKENIZE, 2, ["b.txt: not UTF-8 text (byte 3)"],
         both(write("c/a.txt", "fine"), write("c/b.txt", b"abc\xff")), absent=("out/tokens.json",)),
    Case("tokenize_bad_jsonl_line", TOKENIZE, 2, ["c.jsonl:2: not a JSON line"],
         write("c/c.jsonl", '{"text": "a"}\n{"text": \n'), absent=("out/tokens.json",)),
    Case("tokenize_jsonl_without_text", TOKENIZE, 2, ["c.jsonl:1", "\"text\" string"],
         write("c/c.jsonl", '{"body": "a"}\n'), absent=("out/tokens.json",)),
    Case("tokenize_huge_vocab", ["tokenize", "{tmp}/c", "--out", "{tmp}/out", "--vocab-size", "1000000000000"], 2,
         ["--vocab-size", "outside 257"], write("c/a.txt", "some text"), absent=("out/tokens.json",)),
    Case("tokenize_shares_leave_nothing", [*TOKENIZE, "--val-share", "0.6", "--test-share", "0.5"], 2,
         ["leave no training text"], write("c/a.txt", "x"), absent=("out",)),
    # tokenize's own output inside the corpus: its .bin ids (valid UTF-8: NULs) would be read as documents
    Case("tokenize_out_inside_the_corpus", ["tokenize", "{tmp}/c", "--out", "{tmp}/c/tok", "--tokenizer", "bytes"], 2,
         ["--out", "is inside the corpus", "put --out outside"], write("c/a.txt", "some text"), absent=("c/tok",)),
    Case("tokenize_a_tokenized_folder_in_the_corpus", TOKENIZE, 2, ["c/old/tokens.json is in the corpus", "move"],
         both(write("c/a.txt", "some text"), write("c/old/train.bin", ids(GOOD)), write("c/old/tokens.json", "{}")),
         absent=("out",)),
    Case("tokenize_out_empty", ["tokenize", "{tmp}/c", "--out", "", "--tokenizer", "bytes"], 2, ["--out is empty"],
         write("c/a.txt", "some text"), cwd="w", absent=("w/*",)),
    # --tokenizer-from takes a saved tokenizer whole: a size or kind asked for beside it is not silently dropped
    Case("tokenize_tokenizer_from_with_a_vocab_size", [*TOKENIZE[:-2], "--tokenizer-from", "{tmp}/tok.json",
                                                       "--vocab-size", "500"], 2,
         ["--vocab-size 500 with --tokenizer-from", "drop one of them"], write("c/a.txt", "some text"), absent=("out",)),
    Case("tokenize_tokenizer_from_with_bytes", [*TOKENIZE, "--tokenizer-from", "{tmp}/tok.json"], 2,
         ["--tokenizer bytes with --tokenizer-from"], write("c/a.txt", "some text"), absent=("out",)),
    Case("tokenize_tokenizer_from_empty", [*TOKENIZE[:-2], "--tokenizer-from", ""], 2,
         ["--tokenizer-from is empty"], write("c/a.txt", "some text"), absent=("out",)),
]

# a recipe Dataset of dicts (data/items.py): its items checked as the Python API takes them
LM_DATASETS = write("lmdata.py", """\
import torch


class Dicts(torch.utils.data.Dataset):
    bad = ""

    def __len__(self):
        return 40

    def __getitem__(self, i):
        x = torch.arange(8) % 5
        item = {"input_ids": x, "labels": x.clone()}
        if self.bad == "shape" and i == 13:
            item["input_ids"] = torch.arange(9)
        if self.bad == "label" and i == 0:
            item["labels"][2] = -3
        if self.bad == "nan" and i == 0:
            item["scale"] = torch.tensor(float("nan"))
        return item


class Shapes(Dicts):
    bad = "shape"


class Labels(Dicts):
    bad = "label"


class NaNs(Dicts):
    bad = "nan"
""")
PY = {"PYTHONPATH": "{tmp}"}
CASES += [
    Case("recipe_dicts_differ_in_shape", [*FIT, "data.name=lmdata:Shapes", *RUN], 2,
         ["item 13 holds dict(input_ids: int64[9]", "where item 0 holds dict(input_ids: int64[8]"], LM_DATASETS,
         env=PY, absent=NO_RUN),
    Case("recipe_dicts_bad_target", [*FIT, "data.name=lmdata:Labels", *RUN], 2,
         ["item 0: 'labels' holds -3 at position 2", "or -100"], LM_DATASETS, env=PY, absent=NO_RUN),
    Case("recipe_dicts_nan", [*FIT, "data.name=lmdata:NaNs", *RUN], 2, ["item 0: 'scale' holds NaN/Inf"],
         LM_DATASETS, env=PY, absent=NO_RUN),
]

# `shards:` of .bin token files (data/tokens.py load_token_shards): every shard checked at start-up
SHARDS = ["data.name=shards:{tmp}/s/{a,b}.bin", "data.kwargs.seq_len=8"]


def llmc(magic: int, version: int, values, dtype="uint16", count=None) -> bytes:
    """llm.c's token file: 256 int32 [magic, version, token count], then the ids."""
    head = np.zeros(256, dtype="<i4")
    head[:3] = [magic, version, len(values) if count is None else count]
    return head.tobytes() + ids(values, dtype)


CASES += [
    refused("shards_tokens_one_shard_empty", ["b.bin", "an empty token file (0 bytes)"],
            both(write("s/a.bin", ids(GOOD)), write("s/b.bin", b"")), *SHARDS, "data.kwargs.dtype=uint16",
            "data.kwargs.vocab_size=50"),
    refused("shards_tokens_llmc_header_truncated", ["b.bin", "its llm.c header promises 400 uint16 ids",
                                                    "the file is truncated"],
            both(write("s/a.bin", llmc(20240520, 1, GOOD)), write("s/b.bin", llmc(20240520, 1, GOOD[:100], count=400))),
            *SHARDS),
    refused("shards_tokens_llmc_header_count_too_small", ["b.bin", "its llm.c header promises 100 uint16 ids",
                                                          "600 past them", "the header's count is wrong"],
            both(write("s/a.bin", llmc(20240520, 1, GOOD)), write("s/b.bin", llmc(20240520, 1, GOOD, count=100))),
            *SHARDS),
    refused("shards_tokens_llmc_odd_trailing_byte", ["a.bin", "1 past them"],
            both(write("s/a.bin", llmc(20240520, 1, GOOD) + b"\x01"), write("s/b.bin", llmc(20240520, 1, GOOD))),
            *SHARDS),
    refused("shards_tokens_take_the_val_file", ["val.bin is the val file of", "tokens.json",
                                                "would train on the held-out text", "name the train files"],
            both(write("s/train.bin", ids(GOOD)), write("s/val.bin", ids(GOOD[:100])),
                 write("s/tokens.json", json.dumps({"dtype": "uint16", "vocab_size": 50, "tokens": {"train": 400, "val": 100},
                                                    "files": {"train": "train.bin", "val": "val.bin"}}))),
            "data.name=shards:{tmp}/s/*.bin", "data.kwargs.seq_len=8"),
    refused("shards_tokens_mismatched_dtypes", ["shards with mismatched dtypes", "a.bin holds uint16 ids", "b.bin uint32"],
            both(write("s/a.bin", llmc(20240520, 1, GOOD)), write("s/b.bin", llmc(20240801, 7, GOOD, "uint32"))),
            *SHARDS),
    refused("shards_tokens_llmc_unknown_version", ["a.bin", "version 3, not 1"],
            both(write("s/a.bin", llmc(20240520, 3, GOOD)), write("s/b.bin", ids(GOOD))), *SHARDS),
    refused("shards_tokens_odd_dtype", ["data.kwargs.dtype", "'uint16' or 'uint32'"],
            both(write("s/a.bin", ids(GOOD)), write("s/b.bin", ids(GOOD))), *SHARDS, "data.kwargs.dtype=int16",
            "data.kwargs.vocab_size=50"),
]

# `ecotrain update` of a language model (assembly/update_lm.py): new data of another tokenizer, before anything trains
_LM: dict = {}
PROSE = "the cat sat on a mat while dogs ran over green hills and birds sang in tall trees".split()
CODE = "def return self if else for in while import class lambda yield none true false".split()


def lm_registry(*corpora: str):
    """tmp/reg: a registry whose v0001 is a nanoGPT trained on `ecotrain tokenize`d prose (BPE, 300 ids),
    made once a session in this process; tmp/<name>: the corpora named (C: code with its own BPE of 300
    ids, D: code with the byte tokenizer, 257 ids)."""
    def setup(tmp) -> None:
        import atexit
        import random
        import shutil
        import tempfile
        from pathlib import Path

        from ecotrain import Config, fit
        from ecotrain.assembly.update import register_run
        from ecotrain.data.corpus import tokenize_corpus

        if not _LM:
            home = Path(tempfile.mkdtemp(prefix="ecotrain-hostile-lm-"))
            atexit.register(shutil.rmtree, home, True)
            for name, words in (("prose", PROSE), ("code", CODE)):
                rng = random.Random(len(name))
                (home / name).mkdir()
                for i in range(20):
                    (home / name / f"{i}.txt").write_text(" ".join(rng.choice(words) for _ in range(80)))
            tokenize_corpus(home / "prose", home / "A", 300)
            tokenize_corpus(home / "code", home / "C", 300)
            tokenize_corpus(home / "code", home / "D", tokenizer="bytes")
            fit(Config.model_validate({
                "data": {"name": f"tokens:{home / 'A'}", "batch_size": 4, "kwargs": {"seq_len": 16}},
                "model": {"name": "nanogpt", "kwargs": {"d_model": 16, "n_layers": 1, "n_heads": 2}},
                "loop": {"max_steps": 2, "max_epochs": None}, "logging": {"progress": "off"},
                "ledger": {"enabled": False}}), run_dir=home / "run", quiet=True)
            register_run(home / "reg", home / "run")
            _LM["home"] = home
        shutil.copytree(_LM["home"] / "reg", tmp / "reg")
        for name in corpora:
            shutil.copytree(_LM["home"] / name, tmp / name)
    return setup


LM_REG = ["--registry", "{tmp}/reg"]
CASES += [
    Case("update_lm_corpus_of_another_tokenizer", ["update", "current", "tokens:{tmp}/C", *LM_REG], 2,
         ["NEW_DATA tokens:", "tokenized with another tokenizer than v0001's", "--tokenizer-from"], lm_registry("C"),
         absent=("reg/versions/v0002", "reg/work")),
    Case("update_lm_corpus_of_another_vocabulary", ["update", "current", "{tmp}/D", *LM_REG], 2,
         ["vocabulary of 257", "v0001's model reads 300", "another tokenizer's ids"], lm_registry("D"),
         absent=("reg/versions/v0002", "reg/work")),
    # replay's size is read from the checked config (int() of the raw override crashed on NaN)
    Case("update_lm_replay_size_nan", ["update", "current", "tokens:{tmp}/A", *LM_REG, "--slice", "again",
                                       "methods=[{name: replay, size: .nan}]", "loop.max_steps=1"], 2,
         ["methods.0.replay.size", "finite number"], lm_registry("A"), absent=("reg/versions/v0002",)),
    Case("update_lm_overrides_make_another_model", ["update", "current", "tokens:{tmp}/A", *LM_REG, "--slice", "again",
                                                    "model.kwargs.d_model=32", "loop.max_steps=1"], 2,
         ["the overrides make another model than v0001's", "shape mismatch", "keep v0001's model section"],
         lm_registry("A"), absent=("reg/versions/v0002", "reg/work/*")),
    Case("update_lm_registry_empty", ["update", "{tmp}/reg/versions/v0001", "tokens:{tmp}/A", "--registry", "",
                                      "loop.max_steps=1"], 2, ["--registry is empty"], lm_registry("A"), cwd="w",
         absent=("w/*",)),
    Case("update_lm_npz_is_not_token_data", ["update", "current", "{tmp}/new.npz", *LM_REG], 2,
         ["NEW_DATA", "a language model's new data is token data"],
         both(lm_registry(), write("new.npz", b"PK\x05\x06" + b"\0" * 18)), absent=("reg/versions/v0002",)),
]
