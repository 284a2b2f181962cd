"""The char-level transformer, the stdlib text dataset and the language-model task."""

import torch

from ecotrain import fit
from ecotrain.config import load_config
from ecotrain.data import load_data
from ecotrain.data.text import IGNORE, TextSource, packed_rows, paragraph_rows, read_corpus, stdlib_files
from ecotrain.core.loop import micro_batches
from ecotrain.models import build_model
from ecotrain.models.charlm import CharLM
from ecotrain.core.task import LanguageModelTask, normalized_loss

TEXT = ["data.name=text", "data.kwargs={seq_len: 32, max_bytes: 20000}", "model.name=charlm",
        "model.kwargs={d_model: 32, n_layers: 2, n_heads: 2}"]


def test_causal_no_peeking_at_later_tokens():
    torch.manual_seed(0)
    m = CharLM(vocab=50, max_len=12, d_model=16, n_layers=2, n_heads=2).eval()
    x = torch.randint(0, 50, (2, 12))
    x2 = x.clone()
    x2[:, 7:] = (x2[:, 7:] + 1) % 50
    a, b = m(x), m(x2)
    assert a.shape == (2, 12, 50)
    assert torch.allclose(a[:, :7], b[:, :7], atol=1e-6) and not torch.allclose(a[:, 7:], b[:, 7:])


def test_stdlib_corpus_is_deterministic():
    files = stdlib_files()
    assert files and all(p.suffix == ".py" for p in files) and not any("site-packages" in str(p) for p in files)
    assert files == stdlib_files()
    a, b = read_corpus(5000), read_corpus(5000)
    assert a == b and sum(map(len, a)) == 5000


def test_packed_windows_shift_by_one():
    rows = packed_rows([b"abcdefghij"], 4)
    x, y = TextSource(rows).take(torch.tensor([0, 1]))
    assert x.tolist() == [list(b"abcd"), list(b"efgh")] and y.tolist() == [list(b"bcde"), list(b"fghi")]


def test_paragraphs_pad_per_batch():
    rows, lengths = paragraph_rows([b"x = 1\n\n\ndef f():\n    return 2\n\nshort"], 64, 3)
    assert lengths.tolist() == [4, 20, 4]  # input lengths: bytes - 1
    src = TextSource(rows, lengths)
    x, y = src.take(torch.tensor([0, 2]))
    assert x.shape == (2, 4)  # cut to the batch's longest, not to seq_len
    x, y = src.take(torch.tensor([0, 1]))
    assert x.shape == (2, 20) and (y[0, 4:] == IGNORE).all() and (x[0, 5:] == 0).all()
    assert LanguageModelTask().units((x, y)) == 24


def test_lm_accumulation_with_padding_is_exact():
    torch.manual_seed(0)
    m = CharLM(vocab=40, max_len=10, d_model=16, n_layers=1, n_heads=2).double()
    x = torch.randint(0, 40, (5, 10))
    y = torch.randint(0, 40, (5, 10))
    y[0, 3:] = IGNORE
    y[3, 1:] = IGNORE  # very uneven real lengths
    task = LanguageModelTask()
    task.loss(m(x), (x, y)).backward()
    big = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    total = task.units((x, y))
    for xm, ym in micro_batches((x, y), 3):
        normalized_loss(task, m(xm), (xm, ym), total).backward()
    for a, b in zip(big, (p.grad for p in m.parameters())):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)


def test_text_bundle_and_registry():
    cfg = load_config(None, TEXT)
    bundle = load_data(cfg)
    assert bundle.extra["task"] == "lm" and bundle.num_classes == 256 and bundle.input_shape == (32,)
    assert load_data(cfg).content_hash == bundle.content_hash
    model = build_model(cfg.model, bundle.input_shape, bundle.num_classes)
    assert isinstance(model, CharLM) and model.max_len == 32


def test_lm_fit_learns(tmp_path):
    cfg = load_config(None, [*TEXT, "data.batch_size=16", "loop.max_steps=40", "loop.max_epochs=null",
                             "optim.lr=3e-3", "logging.progress='off'", "memory.activation_checkpointing=all"])
    s = fit(cfg, run_dir=tmp_path).summary
    assert s["test_accuracy"] > 0.15 and s["test_bits_per_char"] < 6.0  # uniform bytes: 8 bits
