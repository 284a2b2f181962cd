"""A language model through `ecotrain export`, `predict` and `card` (issue 50): tiny nanoGPT and GPT-2 runs
(d_model 32, one layer, a few steps) exported to .pt2 and ONNX with a dynamic batch and sequence length
(1 token to the model's context), parity checked at lengths other than the traced one, the tied weights
read back through ecotrain's safe reader; prompts continued from the run and from its export, greedy and
seeded sampling reproducible; every hostile input one line, exit 2."""

import importlib.util
import json
import subprocess
import sys

import pytest
import torch

from ecotrain import Config, fit
from ecotrain.cli import main
from ecotrain.export.inference import load_trained
from ecotrain.base.safeload import load_pt2
from tests.conftest import ROOT, run_cli

HAS_ONNX = all(importlib.util.find_spec(m) for m in ("onnx", "onnxscript", "onnxruntime"))
SEQ, CONTEXT = 16, 24  # the data's windows, and a model that takes more (checked on random ids at 24)


def _train(root, name, model):
    cfg = Config.model_validate({
        "name": name, "seed": 0,
        "data": {"name": "text", "batch_size": 8, "val_split": 0.05, "test_split": 0.05,
                 "kwargs": {"seq_len": SEQ, "max_bytes": 20000}},
        "model": model, "optim": {"lr": 3e-3},
        "loop": {"max_steps": 4, "max_epochs": None, "eval_every": 4, "log_every": 2},
        "logging": {"progress": "off"}, "ledger": {"energy": "off"}})
    return fit(cfg, run_dir=root / name, quiet=True).run_dir


@pytest.fixture(scope="module")
def nano(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm")
    return _train(root, "nano", {"name": "nanogpt", "kwargs": {"d_model": 32, "n_layers": 1, "n_heads": 2,
                                                                "max_len": CONTEXT}})


def _eager_vs(run, fn, shapes):
    model = load_trained(run, device="cpu").model
    g = torch.Generator().manual_seed(1)
    worst = 0.0
    with torch.no_grad():
        for b, t in shapes:
            ids = torch.randint(256, (b, t), generator=g)
            worst = max(worst, float((fn(ids) - model(ids)).abs().max()))
    return worst


def test_nanogpt_exports_with_a_dynamic_sequence_length_and_parity_at_other_lengths(nano):
    r = run_cli("export", nano)
    assert r.returncode == 0, r.stderr
    assert "input_ids [batch, 1..24] int64; tokenizer inside" in r.stdout
    assert "sequence lengths 1, 8, 24" in r.stdout
    rec = json.loads((nano / "export.json").read_text())["files"]["model.pt2"]
    assert rec["inputs"][0]["shape"][1] == {"min": 1, "max": CONTEXT}
    assert set(rec["lengths"]) == {"1", "8", str(CONTEXT)} and rec["max_abs_diff"] <= 1e-5
    assert rec["fresh_process"]["max_abs_diff"] <= 1e-5  # the file, run by a python without transformers
    assert rec["program"]["test_perplexity"] == pytest.approx(rec["eager"]["test_perplexity"], rel=1e-6)
    ep, extra = load_pt2(nano / "model.pt2")  # the tied head and embedding, through the safe reader
    assert json.loads(extra["tokenizer.json"])["ecotrain_tokenizer"] == "bytes"
    program = ep.module()
    assert _eager_vs(nano, program, [(3, 5), (1, 1), (2, CONTEXT)]) <= 1e-5
    with pytest.raises(Exception):  # past the context the program's own guard refuses
        program(torch.zeros(1, CONTEXT + 1, dtype=torch.long))
    card = (nano / "README.md").read_text()
    assert "- context length: 24 tokens" in card and "counted once" in card and "--prompt" in card
    if HAS_ONNX:
        assert main(["export", str(nano), "--format", "onnx"]) == 0
        rec = json.loads((nano / "export.json").read_text())["files"]["model.onnx"]
        assert rec["onnxruntime"]["max_abs_diff"] <= 1e-4 and set(rec["lengths"]) == {"1", "8", str(CONTEXT)}
        from ecotrain.export.onnxfile import load
        assert _eager_vs(nano, load(nano / "model.onnx"), [(3, 5), (1, 1), (2, CONTEXT)]) <= 1e-4


@pytest.fixture
def predict(capsys):
    """`ecotrain predict ... --format jsonl` through the CLI's entry point, in this process: its records."""
    def run(*args):
        capsys.readouterr()
        assert main(["predict", *map(str, args), "--format", "jsonl"]) == 0, capsys.readouterr().err
        return [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    return run


def test_predict_continues_prompts_greedy_and_seeded_from_the_run_and_its_export(nano, predict):
    if not (nano / "model.pt2").exists():
        assert run_cli("export", nano).returncode == 0
    greedy = ["--prompt", "def main(", "--prompt", "import os", "--max-new-tokens", "30"]
    run, exported = predict(nano, *greedy), predict(nano / "model.pt2", *greedy)
    assert [r["ids"] for r in run] == [r["ids"] for r in exported]  # eager and the program agree, token for token
    assert run[0]["prompt_tokens"] == 9 and all(r["new_tokens"] == 30 and r["decoding"] == "greedy" for r in run)
    assert run[0]["window_dropped"] == 9 + 30 - 1 - CONTEXT  # the window slid past the context
    sampled = ["--prompt", "def main(", "--prompt", "import os", "--sample", "--temperature", "0.8", "--top-k", "20",
               "--max-new-tokens", "12"]
    a, b = predict(nano, *sampled, "--seed", "5"), predict(nano, *sampled, "--seed", "5")
    c = predict(nano, *sampled, "--seed", "6")
    assert a == b and a != c and a[0]["seed"] == 5
    assert predict(nano, "--prompt", "import os", *sampled[4:], "--seed", "5")[0]["ids"] == a[1]["ids"]  # alone too
    text = run_cli("predict", nano, "--prompt", "def main(", "--max-new-tokens", "30")
    assert text.returncode == 0 and text.stdout == "def main(" + run[0]["completion"] + "\n"


@pytest.mark.parametrize("args, says", [
    (["--prompt", ""], "--prompt 1: an empty prompt"),
    (["--prompt", "x" * (CONTEXT + 1)], "25 tokens, more than the model's context of 24"),
    (["--prompt", "ab\udcffc"], "--prompt 1: not UTF-8 text (byte 0xff at character 2)"),
    (["--prompts", "{bad}"], "line 2 is not UTF-8 text (byte 0xff"),
    (["--prompts", "{blank}"], "line 2: an empty prompt"),
    (["--prompt", "a", "--max-new-tokens", "-1"], "--max-new-tokens -1: give 1 to 100,000"),
    (["--prompt", "a", "--max-new-tokens", str(10**30)], "--max-new-tokens 1000000000000000000000000000000: give 1"),
    (["--prompt", "a", "--sample", "--temperature", "nan"], "--temperature nan: a finite number above 0"),
    (["--prompt", "a", "--sample", "--temperature", "0"], "--temperature 0.0: a finite number above 0"),
    (["--prompt", "a", "--temperature", "0.7"], "--temperature: only with --sample"),
    (["--prompt", "a", "--sample", "--top-k", "0"], "--top-k 0: 1 or more"),
    (["--prompt", "a", "--data", "x.npz"], "--data: a language model continues --prompt TEXT"),
    ([], "give --data FILE|KEY=VALUE and --out CSV (a language model: --prompt TEXT"),
])
def test_predict_refuses_hostile_prompts_and_flags_in_one_line(nano, tmp_path, capsys, args, says):
    (tmp_path / "bad.txt").write_bytes(b"def a(\n\xff\xfeabc\n")
    (tmp_path / "blank.txt").write_text("x = 1\n\nfoo\n")
    args = [a.format(bad=tmp_path / "bad.txt", blank=tmp_path / "blank.txt") for a in args]
    capsys.readouterr()
    assert main(["predict", str(nano), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err


def test_non_utf8_prompt_bytes_through_the_real_cli(nano):
    r = subprocess.run([sys.executable, "-m", "ecotrain", "predict", str(nano), "--prompt", b"ab\xffc"], cwd=ROOT,
                       capture_output=True, timeout=300)
    err = r.stderr.decode(errors="replace").strip().splitlines()
    assert r.returncode == 2 and err[-1] == ("ecotrain: error: --prompt 1: not UTF-8 text (byte 0xff at character 2); "
                                             "give the prompt as UTF-8")


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs the lm extra")
def test_a_tied_gpt2_exports_with_dynamic_sequence_parity_and_continues_from_its_onnx(tmp_path, predict):
    run = _train(tmp_path, "gpt2", {"name": "causal_lm", "kwargs": {"arch": "gpt2", "d_model": 32, "n_layers": 1,
                                                                     "n_heads": 2}})
    fmt = "onnx" if HAS_ONNX else "pt2"
    assert main(["export", str(run), "--format", fmt]) == 0
    rec = json.loads((run / "export.json").read_text())["files"][f"model.{fmt}"]
    assert rec["inputs"][0]["shape"][1] == {"min": 1, "max": SEQ}  # n_positions: the data's windows
    assert set(rec["lengths"]) == {"1", "8"} and rec["max_abs_diff"] <= 1e-4
    model = load_trained(run, device="cpu").model
    assert model.hf.lm_head.weight is model.hf.transformer.wte.weight  # tied as trained
    got = predict(run / f"model.{fmt}", "--prompt", "class A", "--max-new-tokens", "8")
    assert got[0]["ids"] == predict(run, "--prompt", "class A", "--max-new-tokens", "8")[0]["ids"]
    params = sum(p.numel() for p in model.parameters())  # torch counts a tied parameter once
    assert main(["card", str(run)]) == 0
    assert f"- parameters: {params:,} (tied: `hf.lm_head.weight` is" in (run / "README.md").read_text()


def test_generation_stops_at_end_of_document_and_top_k_1_is_greedy():
    from ecotrain.data.tokenizer import ByteTokenizer
    from ecotrain.export.generate import Decoding, LanguageModel, continue_prompt

    def model(ids):  # favours the id after the last one, and end of document (256) after 3 tokens
        logits = torch.zeros(1, ids.shape[1], 257)
        logits[0, -1, 256 if ids.shape[1] >= 3 else (int(ids[0, -1]) + 1) % 256] = 5.0
        return logits

    lm = LanguageModel(model, 8, 257, ByteTokenizer(), "stub")
    got = continue_prompt(lm, [65], Decoding(10))
    assert got == {"ids": [66, 67, 256], "stopped": "end_of_document", "dropped": 0}
    assert continue_prompt(lm, [65], Decoding(10, True, 0.5, 1, 3))["ids"] == [66, 67, 256]
    plain = LanguageModel(model, 8, 256, ByteTokenizer(), "stub")  # a vocabulary without the end-of-document id
    assert continue_prompt(plain, [65], Decoding(4)) == {"ids": [66, 67, 256, 256], "stopped": "max_new_tokens",
                                                          "dropped": 0}
