"""Tokenizers trained on the corpus (data/tokenizer.py) and `ecotrain tokenize` (data/corpus.py)."""

import json
import os
from types import SimpleNamespace

import numpy as np
import pytest

from ecotrain.data import corpus, tokenizer
from ecotrain.data.corpus import tokenize_corpus
from ecotrain.data.tokenizer import ByteTokenizer, load_tokenizer, train_bpe
from ecotrain.base.errors import ConfigError, DataError
from ecotrain.assembly.update_lm import tokenizer_id
from ecotrain.export.lm import run_tokenizer
from tests.helpers.deadline import deadline

TEXT = ["the cat sat on the mat, the cat ran", "über café 日本語 — tabs\tand\nnewlines  ", "print('hello')\n" * 5]


def _docs(folder, n=12):
    folder.mkdir()
    for i in range(n):
        (folder / f"{i:02d}.txt").write_text(f"document {i}: " + TEXT[i % 3])
    return folder


def test_bpe_round_trips_any_text_and_keeps_its_size():
    tok = train_bpe(TEXT * 20, 300)
    assert tok.vocab_size <= 300 and tok.eod == 0
    for text in TEXT + ["never seen: ∑ 🙂 \x00"]:
        assert tok.decode(tok.encode(text)) == text
    assert len(tok.encode(TEXT[0])) < len(TEXT[0].encode())  # merges learnt


def test_saved_tokenizers_load_back(tmp_path):
    for tok in (train_bpe(TEXT, 280), ByteTokenizer()):
        (tmp_path / "tokenizer.json").write_text(tok.to_json())
        back = load_tokenizer(tmp_path)
        assert back.kind == tok.kind and back.encode(TEXT[1]) == tok.encode(TEXT[1]) and back.eod == tok.eod


@pytest.mark.parametrize("content, words", [(b"{not json", "not a readable tokenizer file"),
                                             (b'{"model": 3}', "not a tokenizers tokenizer"),
                                             (b"\xff\xfe", "the tokenizer file is not UTF-8 text"),
                                             (b"[" * 100_000, "JSON nested too deep to read")])
def test_a_damaged_tokenizer_file_is_one_line(tmp_path, content, words):
    (tmp_path / "tokenizer.json").write_bytes(content)
    with pytest.raises(DataError, match=words):
        load_tokenizer(tmp_path)


def test_a_tokenizer_json_that_is_a_fifo_is_one_line_for_every_reader(tmp_path):
    """--tokenizer-from DIR, predict --tokenizer F, a run's own tokenizer.json, the copy into the run folder:
    each reads through safefile (a FIFO with no writer would block them forever, past SIGTERM)."""
    folder = tmp_path / "tok"
    folder.mkdir()
    fifo = folder / "tokenizer.json"
    os.mkfifo(fifo)
    said = (f"{fifo}: the tokenizer file is a FIFO (named pipe), not a regular file; give the tokenizer.json its "
            "tokens were made with (ecotrain tokenize writes one)")
    reads = {"load": lambda: load_tokenizer(folder),
             "--tokenizer-from": lambda: tokenize_corpus(_docs(tmp_path / "c"), tmp_path / "out", tokenizer_from=folder),
             "predict --tokenizer": lambda: run_tokenizer(tmp_path, "text", given=str(fifo)),
             "the run's own": lambda: run_tokenizer(folder, "text"),  # not taken for "no tokenizer": bytes
             "saved into the run": lambda: tokenizer.save_tokenizer(tmp_path, str(fifo)),
             "update's tokenizer id": lambda: tokenizer_id(SimpleNamespace(num_classes=300,
                                                                           extra={"tokenizer": str(fifo)}), "tokens")}
    for what, read in reads.items():
        with deadline(20, what), pytest.raises(DataError) as err:
            read()
        assert str(err.value) == said, what
    assert not (tmp_path / "out").exists() and not (tmp_path / "tokenizer.json").exists()


def test_a_tokenizer_json_above_the_limit_is_refused_unread(tmp_path, monkeypatch):
    (tmp_path / "tokenizer.json").write_text(ByteTokenizer().to_json() + " " * 100)
    assert load_tokenizer(tmp_path).kind == "bytes"
    monkeypatch.setattr(tokenizer, "TOKENIZER_MAX_BYTES", 64)
    with pytest.raises(DataError, match=r"tokenizer.json: the tokenizer file is 1.. bytes, more than the 64 bytes"):
        load_tokenizer(tmp_path)


def test_vocab_size_bounds():
    with pytest.raises(ConfigError, match="outside 257"):
        train_bpe(TEXT, 100)
    with pytest.raises(ConfigError, match="outside 257"):
        train_bpe(TEXT, 10 ** 12)


def test_tokenize_writes_documents_with_their_ends(tmp_path):
    meta = tokenize_corpus(_docs(tmp_path / "c"), tmp_path / "out", vocab_size=300, val_share=0.25)
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["tokenizer.json", "tokens.json", "train.bin", "val.bin"]
    assert meta.documents == {"train": 9, "val": 3} and json.loads((out / "tokens.json").read_text())["eod"] == meta.eod
    ids = np.fromfile(out / "train.bin", dtype=np.uint16)
    assert len(ids) == meta.tokens["train"] and (ids == meta.eod).sum() == 9 and ids[-1] == meta.eod
    tok = load_tokenizer(out)
    first = ids[: int(np.argmax(ids == meta.eod))]
    assert tok.decode(first.tolist()) == "document 0: " + TEXT[0]


def test_one_document_is_cut_by_position_and_jsonl_lines_are_documents(tmp_path):
    (tmp_path / "one.txt").write_text("abc " * 500)
    meta = tokenize_corpus(tmp_path / "one.txt", tmp_path / "o1", tokenizer="bytes", val_share=0.1, test_share=0.1)
    assert meta.tokens == {"train": 1601, "val": 200, "test": 200} and meta.vocab_size == 257
    (tmp_path / "c.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in TEXT * 4) + "\n\n")
    meta = tokenize_corpus(tmp_path / "c.jsonl", tmp_path / "o2", tokenizer="bytes", val_share=0.25)
    assert meta.documents == {"train": 9, "val": 3}


def test_without_the_library_bytes_are_the_fallback(tmp_path, monkeypatch, ecotrain_log):
    monkeypatch.setattr(tokenizer, "_tokenizers", lambda: None)
    meta = tokenize_corpus(_docs(tmp_path / "c"), tmp_path / "out", vocab_size=300)
    assert meta.vocab_size == 257 and meta.eod == 256 and "using the byte-level tokenizer" in ecotrain_log.text


def test_a_failed_tokenize_leaves_the_old_folder_and_no_temporary(tmp_path, monkeypatch):
    c = _docs(tmp_path / "c")
    tokenize_corpus(c, tmp_path / "out", tokenizer="bytes")
    before = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    (c / "05.txt").write_bytes(b"\xff\xfe bad")
    with pytest.raises(DataError, match=r"05.txt: not UTF-8 text \(byte 0\)"):
        tokenize_corpus(c, tmp_path / "out", tokenizer="bytes")
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == before

    def boom(*a):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(corpus, "_cut_one_document", boom)
    (tmp_path / "one.txt").write_text("x" * 100)
    with pytest.raises(OSError):
        tokenize_corpus(tmp_path / "one.txt", tmp_path / "out", tokenizer="bytes")
    assert {p.name for p in (tmp_path / "out").iterdir()} == set(before)  # no .tokenize-* left


def test_a_killed_tokenize_leaves_nothing_the_next_one_keeps(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    c = tmp_path / "c"
    c.mkdir()
    for i in range(400):  # enough text that the kill lands while it writes
        (c / f"{i:03d}.txt").write_text(f"document {i}: " + " ".join(TEXT) * 200)
    out = tmp_path / "out"
    p = subprocess.Popen([sys.executable, "-m", "ecotrain", "tokenize", str(c), "--out", str(out),
                          "--tokenizer", "bytes"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not list(out.glob(".tokenize-*")) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    os.kill(p.pid, signal.SIGKILL)
    p.wait(60)
    left = list(out.glob(".tokenize-*"))
    assert left, "the kill came after the command had finished: make the corpus larger"
    tokenize_corpus(c, out, tokenizer="bytes")  # the next tokenize into the folder
    assert sorted(p.name for p in out.iterdir()) == ["tokenizer.json", "tokens.json", "train.bin", "val.bin"]


def test_two_tokenize_into_one_folder_the_second_is_one_line(tmp_path):
    from ecotrain.base.filelock import try_lock_folder, unlock

    c, out = _docs(tmp_path / "c"), tmp_path / "out"
    out.mkdir()
    held = try_lock_folder(out)  # what a tokenize writing there holds
    try:
        with pytest.raises(DataError, match=r"--out .*out: another tokenize is writing this folder"):
            tokenize_corpus(c, out, tokenizer="bytes")
    finally:
        unlock(held)
    assert list(out.iterdir()) == []
    tokenize_corpus(c, out, tokenizer="bytes")
    assert (out / "tokens.json").is_file()


def _corpus(tmp_path):
    (tmp_path / "c").mkdir(exist_ok=True)
    for i in range(12):
        (tmp_path / "c" / f"d{i}.txt").write_text(f"alpha beta gamma {i} delta\n" * 3)
    return tmp_path / "c"


def _saved(tmp_path, tok, name):
    path = tmp_path / f"{name}.json"
    path.write_text(tok.to_str())
    return path


def test_hostile_saved_tokenizers_are_one_line_or_right(tmp_path):
    """--tokenizer-from with a BPE lacking the end-of-document token, a WordLevel with no unknown token,
    and one whose added token's id passes its stated vocabulary (a uint16 file would wrap it)."""
    tk = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers

    no_eod = tk.Tokenizer(models.BPE())
    no_eod.pre_tokenizer = pre_tokenizers.ByteLevel()
    no_eod.train_from_iterator(["alpha beta gamma delta"] * 20, tk.trainers.BpeTrainer(vocab_size=300))
    with pytest.raises(DataError, match="no end-of-document token"):
        tokenize_corpus(_corpus(tmp_path), tmp_path / "o1", tokenizer_from=str(_saved(tmp_path, no_eod, "no_eod")))

    word = tk.Tokenizer(models.WordLevel({"alpha": 0, "<|endoftext|>": 1}))
    word.pre_tokenizer = pre_tokenizers.Whitespace()
    with pytest.raises(DataError, match="cannot encode the text"):
        tokenize_corpus(_corpus(tmp_path), tmp_path / "o2", tokenizer_from=str(_saved(tmp_path, word, "word")))

    far = tk.Tokenizer(models.WordLevel({"alpha": 0, "[UNK]": 1}, unk_token="[UNK]"))
    far.pre_tokenizer = pre_tokenizers.Whitespace()
    far.add_special_tokens(["<|endoftext|>"])
    vocab = far.get_vocab(with_added_tokens=True)
    got = load_tokenizer(_saved(tmp_path, far, "far"))
    assert got.vocab_size == max(vocab.values()) + 1 and got.eod == vocab["<|endoftext|>"]
