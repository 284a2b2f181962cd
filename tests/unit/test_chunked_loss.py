"""Chunked loss (core/chunked_loss.py): the LM head + cross-entropy over token chunks gives the
gradients of the whole-logits loss (float32, max relative difference <= 1e-5) and never holds them."""

import copy
import logging
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from ecotrain.core.chunked_loss import (HeadInput, _liger_class, apply_chunked_loss, chunked_cross_entropy,
                                          find_head, fused_loss, is_head_input)
from ecotrain.base.errors import ConfigError
from ecotrain.models.charlm import CharLM


def _tiny(seed=0, vocab=97):
    torch.manual_seed(seed)
    return CharLM(vocab=vocab, max_len=64, d_model=32, n_layers=2, n_heads=4)


def _grads(model, x, y, chunked: bool, reduction="mean"):
    model.zero_grad(set_to_none=True)
    out = model(x)
    if chunked:
        assert is_head_input(out)
        loss = chunked_cross_entropy(out, y, reduction)
    else:
        loss = F.cross_entropy(out.flatten(0, 1), y.reshape(-1), ignore_index=-100, reduction=reduction)
    (loss if loss.ndim == 0 else loss.sum()).backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _rel(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


@pytest.mark.parametrize("chunk", [7, 16, 1000])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_gradients_equal_unchunked(chunk, reduction):
    ref = _tiny()
    model = copy.deepcopy(ref)
    apply_chunked_loss(model, chunk)
    x = torch.randint(0, 97, (3, 40))
    y = torch.randint(0, 97, (3, 40))
    y[1, 30:] = -100  # padding targets count for nothing
    l0, g0 = _grads(ref, x, y, False, reduction)
    l1, g1 = _grads(model, x, y, True, reduction)
    assert _rel(l1, l0) <= 1e-5
    worst = max(_rel(g1[n], g0[n]) for n in g0)
    assert worst <= 1e-5, worst


def test_per_token_losses_and_bias():
    torch.manual_seed(1)
    head = torch.nn.Linear(8, 50)
    h = torch.randn(2, 9, 8, requires_grad=True)
    y = torch.randint(0, 50, (2, 9))
    ref = F.cross_entropy(head(h).flatten(0, 1), y.reshape(-1), reduction="none")
    hi = h.as_subclass(HeadInput)
    hi.head, hi.chunk = head, 4
    out = chunked_cross_entropy(hi, y, "none")
    assert _rel(out.detach(), ref.detach()) <= 1e-6
    g_ref = torch.autograd.grad(ref.sum(), [h, head.weight, head.bias])
    g = torch.autograd.grad(out.sum(), [h, head.weight, head.bias])
    assert max(_rel(a, b) for a, b in zip(g, g_ref)) <= 1e-5


def test_eval_gives_logits_and_no_head_is_one_line():
    model = _tiny()
    apply_chunked_loss(model, 8)
    with torch.no_grad():
        out = model(torch.randint(0, 97, (1, 10)))
    assert type(out) is torch.Tensor and out.shape == (1, 10, 97)
    with pytest.raises(ConfigError, match="memory.chunked_loss"):
        find_head(torch.nn.Sequential(torch.nn.Linear(2, 2)))


def test_state_dict_unchanged():
    ref = _tiny()
    model = copy.deepcopy(ref)
    apply_chunked_loss(model, 8)
    assert list(model.state_dict()) == list(ref.state_dict())


def test_logits_never_whole():
    """The largest tensor autograd keeps is a weight (the head's), never the [tokens, vocab] logits."""
    model = _tiny(vocab=4096)
    apply_chunked_loss(model, 16)
    sizes = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.numel()) or t, lambda t: t):
        out = model(torch.randint(0, 4096, (2, 64)))
        chunked_cross_entropy(out, torch.randint(0, 4096, (2, 64)))
    assert max(sizes) <= model.head.weight.numel() < 2 * 64 * 4096  # the whole logits: 2*64*4096


def test_liger_is_chosen_on_cuda_only_and_its_absence_is_one_line(monkeypatch, caplog):
    """Which path the lever takes (no GPU here: the selection, not the kernel). A module standing in for
    liger_kernel.transformers records what ecotrain would construct; None in sys.modules: not installed."""
    made = []

    class Fused:
        def __init__(self, **kw):
            made.append(kw)

    fake = types.ModuleType("liger_kernel.transformers")
    fake.LigerFusedLinearCrossEntropyLoss = Fused
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", fake)
    _liger_class.cache_clear()
    assert fused_loss("cpu", "mean") is None and not made  # CPU: ecotrain's own, Liger not even looked up
    assert _liger_class.cache_info().currsize == 0
    assert fused_loss("cuda", "none") is None  # per-token losses: ecotrain's own
    assert isinstance(fused_loss("cuda", "sum"), Fused) and made == [{"ignore_index": -100, "reduction": "sum"}]
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", None)  # an import of it raises ImportError
    _liger_class.cache_clear()
    with caplog.at_level(logging.INFO, logger="ecotrain"):
        assert fused_loss("cuda", "mean") is None and fused_loss("cuda", "mean") is None
    said = [r.getMessage() for r in caplog.records if "Liger" in r.getMessage()]
    assert len(said) == 1 and "pip install liger-kernel" in said[0] and "\n" not in said[0]
    _liger_class.cache_clear()


def test_chunked_loss_under_zero3_is_refused_in_one_line_and_zero2_allowed():
    from ecotrain.config import load_config
    from ecotrain.base.errors import ConfigError

    with pytest.raises(ConfigError, match=r"memory.chunked_loss=on with distributed.strategy=fsdp: .*zero2"):
        load_config("recipes/lm_small.yaml", ["memory.chunked_loss=on", "distributed.strategy=fsdp"])
    cfg = load_config("recipes/lm_small.yaml", ["memory.chunked_loss=on", "distributed.strategy=zero2"])
    assert cfg.memory.chunked_loss == "on" and not cfg.distributed.fsdp.reshard_after_forward


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_the_head_of_any_hf_causal_lm_is_found_and_its_gradients_match(arch):
    """transformers' models keep their head as `hf.lm_head`: found through get_output_embeddings(),
    and the chunked loss through the real HF forward gives the whole-logits gradients."""
    pytest.importorskip("transformers")
    from ecotrain.models.causal_lm import causal_lm

    torch.manual_seed(0)
    ref = causal_lm(arch, vocab_size=61, max_len=32, d_model=32, n_layers=1, n_heads=4)
    model = copy.deepcopy(ref)
    assert find_head(model) is model.hf.get_output_embeddings()
    apply_chunked_loss(model, 9)
    x = torch.randint(0, 61, (2, 20))
    y = torch.randint(0, 61, (2, 20))
    l0, g0 = _grads(ref, x, y, False)
    l1, g1 = _grads(model, x, y, True)
    assert _rel(l1, l0) <= 1e-5
    assert max(_rel(g1[n], g0[n]) for n in g0) <= 1e-5
