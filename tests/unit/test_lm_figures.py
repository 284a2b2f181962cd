"""The figures a language-model user reads: perplexity and bits per byte from a known loss, one
cross-entropy per batch for all of them, CPU attention in the FLOP count, MFU against a table of
peaks (none invented for a CPU), cost per million tokens, and lower-is-better metrics in compare/green."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from ecotrain.core import metrics as M
from ecotrain.accounting.compare import compare
from ecotrain.accounting.flops import StepFlops, attention_flops
from ecotrain.accounting.peaks import matmul_precision, mfu, peak_flops
from ecotrain.accounting.report import lower_is_better
from ecotrain.accounting.tokens import tokens_section
from ecotrain.data import ArraySource
from ecotrain.green.output import pareto
from ecotrain.core.loop import evaluate
from ecotrain.core.task import LanguageModelTask


class Uniform(torch.nn.Module):
    """Equal logits over `vocab` tokens: the loss per token is ln(vocab), whatever the target."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab = vocab

    def forward(self, x):
        return torch.zeros(*x.shape, self.vocab)


def test_perplexity_and_bits_per_byte_of_a_known_loss():
    x = torch.randint(0, 8, (6, 5))
    y = torch.randint(0, 8, (6, 5))
    y[0, 2:] = -100  # padding: not a token
    got = evaluate(Uniform(8), ArraySource(x, y), LanguageModelTask(bytes_per_token=2.0), 4, torch.device("cpu"))
    assert got["val_loss"] == pytest.approx(math.log(8))
    assert got["val_perplexity"] == pytest.approx(8.0)  # exp(ln 8)
    assert got["val_bits_per_char"] == pytest.approx(3.0)  # bits per token
    assert got["val_bits_per_byte"] == pytest.approx(1.5)  # 3 bits a token, 2 bytes a token


def test_perplexity_is_exp_of_the_mean_token_loss_and_no_bpb_without_bytes_per_token():
    torch.manual_seed(0)
    x, y = torch.randint(0, 7, (9, 6)), torch.randint(0, 7, (9, 6))
    y[3, 1:] = -100
    model = torch.nn.Embedding(7, 7)
    got = evaluate(model, ArraySource(x, y), LanguageModelTask(), 4, torch.device("cpu"))
    assert "val_bits_per_byte" not in got  # the data did not say its bytes per token: no figure invented
    assert got["val_perplexity"] == pytest.approx(math.exp(got["val_loss"]), rel=1e-6)
    keep = y != -100
    nats = F.cross_entropy(model(x)[keep], y[keep], reduction="sum").detach()
    assert got["val_perplexity"] == pytest.approx(math.exp(float(nats) / int(keep.sum())), rel=1e-6)


def test_one_cross_entropy_per_batch_serves_every_figure():
    calls = []

    def bits(preds, target):
        calls.append(1)
        return preds.sum(), target.numel()

    shared = M.TokenLoss(bits)
    figs = [M.MeanTokenLoss(shared, float), M.MeanTokenLoss(shared, M.perplexity_of_bits)]
    for _ in range(3):
        p, t = torch.ones(2, 3), torch.zeros(2, 3)
        for m in figs:
            m.update(p, t)
    assert len(calls) == 3 and figs[0].compute() == 1.0 and figs[1].compute() == 2.0
    assert M.perplexity_of_bits(5000.0) == math.inf  # a diverged run: inf, not an OverflowError


def test_cpu_attention_is_counted_as_pytorch_counts_its_cuda_kernels():
    # pins torch's own formulas (flop_counter.sdpa_*: not public API) against the one registered for CPU
    q = torch.randn(2, 4, 32, 8, requires_grad=True)
    kv = torch.randn(2, 2, 32, 8, requires_grad=True)  # grouped-query: 2 key/value heads for 4 query heads
    with FlopCounterMode(display=False) as fwd:
        out = F.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
    with FlopCounterMode(display=False) as bwd:
        out.sum().backward()
    assert fwd.get_total_flops() == sdpa_flop_count(q.shape, kv.shape, kv.shape) == attention_flops(q.shape, kv.shape, kv.shape)
    assert bwd.get_total_flops() == sdpa_backward_flop_count(q.shape, q.shape, kv.shape, kv.shape) > 0


def test_peaks_by_device_name_and_none_invented():
    assert peak_flops("NVIDIA H100 80GB HBM3", "bf16")[0] == pytest.approx(989.4e12)
    assert peak_flops("NVIDIA H100 PCIe", "bf16")[0] == pytest.approx(756.5e12)
    assert peak_flops("NVIDIA H200", "tf32")[0] == pytest.approx(494.7e12)
    assert peak_flops("NVIDIA A100-SXM4-80GB", "fp32")[0] == pytest.approx(19.5e12)
    for name in ("NVIDIA H100 NVL", "NVIDIA A10G", "cpu", "Some GPU"):
        peak, why = peak_flops(name, "bf16")
        assert peak is None and why.startswith("unknown")
    assert (matmul_precision("bf16-mixed", False), matmul_precision("fp32", True), matmul_precision("fp32", False)) \
        == ("bf16", "tf32", "fp32")
    got = mfu(989.4e12 * 10, 20.0, 2, "NVIDIA H100 80GB HBM3", "bf16")
    assert got["value"] == pytest.approx(0.25)  # 10 s of peak work over 20 s on 2 devices
    cpu = mfu(1e12, 10.0, 1, "cpu", "fp32")
    assert cpu["value"] is None and "unknown" in cpu["missing_reason"] and cpu["achieved_flops_per_second"] == 1e11
    assert mfu(1e12, 10.0, 1, "cpu", "fp32", given_peak=1e12)["value"] == pytest.approx(0.1)  # ledger.peak_flops


def test_cost_per_million_tokens():
    t = tokens_section(1000, 128.0, StepFlops(total=6e9, forward=2e9, samples=10), kwh=0.256, co2e_kg=0.128,
                       cost=1.28, currency="USD")
    assert t["trained"] == 128000 and t["flops_per_token"] == pytest.approx(6e9 / 10 / 128)
    assert t["per_million"] == pytest.approx({"energy_kwh": 2.0, "co2e_kg": 1.0, "cost": 10.0, "currency": "USD"})


def test_direction_of_metrics():
    for m in ("val_loss", "test_perplexity", "val_bits_per_byte", "test_bits_per_char", "perplexity", "val_mse"):
        assert lower_is_better(m), m
    for m in ("test_accuracy", "val_f1", "val_r2", "accuracy"):
        assert not lower_is_better(m), m
    pts = [(0.2, 12.0), (0.3, 11.0), (0.5, 11.5), (1.0, 10.0)]
    assert pareto(pts, lower=True) == [(0.2, 12.0), (0.3, 11.0), (1.0, 10.0)]  # perplexity: lower is better


def run_folder(path, ppl):
    path.mkdir(parents=True)
    (path / "config.yaml").write_text("name: x\n")
    (path / "summary.json").write_text(json.dumps({"test_perplexity": ppl}))
    ledger = {"name": "x", "steps": 10, "samples": 320, "stopped_because": "max_steps", "segments": 1,
              "wall_seconds": 10.0, "cpu_seconds": 9.0, "cpu_hours": 0.0025, "flops": {"total": 1e9, "train": 1e9, "eval": 0},
              "energy": {"kwh": None, "method": None, "how": None, "source": None, "notes": [], "missing_reason": "off"},
              "co2e": {"kg": None, "g_per_kwh": 50.0, "grid": "FRA", "missing_reason": "no energy figure"},
              "cost": {"amount": 0.01, "currency": "USD", "missing_reason": None}}
    (path / "ledger.json").write_text(json.dumps(ledger))
    return str(path)


def test_compare_on_perplexity_counts_a_rise_as_the_drop(tmp_path):
    base = run_folder(tmp_path / "base", 10.0)
    better, worse = run_folder(tmp_path / "better", 9.0), run_folder(tmp_path / "worse", 10.5)
    text, ok = compare([base], [better], max_accuracy_drop=0.1, min_cost_cut=0.0, by="flops", metric="test_perplexity")
    assert ok and "drop -1.0000" in text
    text, ok = compare([base], [worse], max_accuracy_drop=0.1, min_cost_cut=0.0, by="flops", metric="test_perplexity")
    assert not ok and "drop +0.5000 (allowed 0.1): FAIL" in text
