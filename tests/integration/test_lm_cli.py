"""recipes/lm_small.yaml through the real CLI on a short schedule: an LM's figures in summary.json
(perplexity and bits per byte on val and test, tokens per second), ledger.json (FLOPs per token with
attention, MFU unknown on a CPU rather than invented, cost per million tokens) and `ecotrain ledger`."""

import json
import math

import pytest

pytest.importorskip("transformers")

SHORT = ["data.kwargs.max_bytes=150000", "loop.max_steps=30", "loop.eval_every=15", "loop.log_every=5",
         "schedule.warmup=5", "ledger.energy=off"]


def test_lm_small_short_through_the_cli(cli, tmp_path):
    r = cli("fit", "recipes/lm_small.yaml", *SHORT, "--run-dir", tmp_path, "--quiet")
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "summary.json").read_text())
    for split in ("val", "test"):
        assert s[f"{split}_perplexity"] == pytest.approx(math.exp(s[f"{split}_loss"]), rel=1e-6)
        assert s[f"{split}_bits_per_byte"] == pytest.approx(s[f"{split}_loss"] / math.log(2), rel=1e-6)  # bytes
    assert s["test_perplexity"] < 40  # 256 at random init: it learned something in 30 steps
    assert s["monitor"] == "val_perplexity" and s["best_val_metric"] == pytest.approx(min(
        json.loads(line)["val_perplexity"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
        if "val_perplexity" in line))  # mode min: the lowest perplexity is the best
    assert s["tokens_seen"] == 30 * 16 * 128 and s["tokens_per_second"] > 0
    L = json.loads((tmp_path / "ledger.json").read_text())
    t = L["tokens"]
    assert t["trained"] == s["tokens_seen"] and t["per_sample"] == 128
    d, layers, T, V = 128, 2, 128, 256  # the recipe's GPT-2 per token: 2 x matmul params forward, x 3 with backward
    dense = 2 * (layers * 12 * d * d + d * V)
    attention = 2 * layers * 2 * T * d  # Q K^T and P V over the whole window; backward 2.5x (scores recomputed)
    assert t["flops_per_token"] == 3 * dense + 3.5 * attention
    assert L["mfu"]["value"] is None and L["mfu"]["missing_reason"].startswith("unknown: no dense peak is known for a CPU")
    assert t["per_million"]["cost"] == pytest.approx(L["cost"]["amount"] / t["trained"] * 1e6)
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert any(rec.get("tokens_per_second", 0) > 0 for rec in logged)
    out = cli("ledger", tmp_path)
    assert out.returncode == 0 and "per 1M tokens" in out.stdout and "FLOPs a token" in out.stdout
