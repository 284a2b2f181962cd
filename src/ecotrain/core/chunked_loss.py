"""Chunked loss: the LM head and cross-entropy over chunks of tokens, the logits never whole.

A language model's largest single activation is its logits, `[tokens, vocab]` (with autocast's
float32 copy and log-softmax, three such tensors are kept for backward). `memory.chunked_loss: on`
replaces the head's `forward` on the instance (as checkpointing does: no wrapper module, the same
state_dict keys) with one that, while gradients are recorded, returns its input as a `HeadInput`:
the hidden states, a tensor, that remembers the head. `task.loss` hands it to
`chunked_cross_entropy`, which computes the logits `loss_chunk` tokens at a time and keeps only one
float per token (the log-sum-exp); the backward recomputes each chunk's logits and turns them into
the gradients of the hidden states, the head's weight and bias. Peak: one chunk's logits instead of
every token's. Under `no_grad` (evaluation, metrics) the head runs as written and gives logits.

The gradients are those of `F.cross_entropy` on the whole logits up to the order of float sums (the
head's weight gradient is summed chunk by chunk): tests/unit/test_chunked_loss.py, max relative
difference <= 1e-5 in float32 on a tiny GPT.

On CUDA with Liger Kernel installed (`pip install liger-kernel`), the same lever uses its fused
linear cross-entropy (a Triton kernel) for mean and sum losses (`fused_loss` chooses; without it, one
log line, then ecotrain's own path); on CPU, and for per-token losses, ecotrain's own. Written, not
run (no GPU was lent to this task): tests/unit/test_chunked_loss.py checks which path is chosen.
"""

from __future__ import annotations

import functools
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ecotrain.base.errors import ConfigError
from ecotrain.base.log import log

IGNORE = -100
HEAD_NAMES = ("head", "lm_head", "output")  # the attribute a causal LM's vocabulary projection has


class HeadInput(torch.Tensor):
    """The head's input, standing in for its logits while gradients are recorded: `.head` is the
    nn.Linear to apply, `.chunk` the tokens per chunk. A real tensor, so DDP's and FSDP's output hooks
    see it (they register their backward hooks on the outputs' tensors)."""

    head: nn.Linear
    chunk: int


def is_head_input(out) -> bool:
    """The head's stand-in itself (an op on it gives a HeadInput without `.head`: not one)."""
    return isinstance(out, HeadInput) and "head" in out.__dict__


def find_head(model: nn.Module) -> nn.Linear:
    """The vocabulary projection: what a Hugging Face model's `get_output_embeddings()` names (any HF
    causal LM, on the model or the module it wraps: `.hf`, `.model`), else an nn.Linear named head /
    lm_head / output there; else one line saying what to do."""
    owners = [o for o in (model, getattr(model, "hf", None), getattr(model, "model", None)) if isinstance(o, nn.Module)]
    for owner in owners:
        get = getattr(owner, "get_output_embeddings", None)
        try:
            mod = get() if callable(get) else None
        except (NotImplementedError, AttributeError, TypeError):  # a base class that has none
            mod = None
        if isinstance(mod, nn.Linear):
            return mod
    for owner in owners:
        for name in HEAD_NAMES:
            mod = getattr(owner, name, None)
            if isinstance(mod, nn.Linear):
                return mod
    raise ConfigError("memory.chunked_loss: the model has no vocabulary projection ecotrain can find (neither "
                      "get_output_embeddings() nor an nn.Linear named head, lm_head or output) whose output is the "
                      "logits; set memory.chunked_loss=off")


def apply_chunked_loss(model: nn.Module, chunk: int) -> nn.Linear:
    """Make the model's head return a `HeadInput` while gradients are recorded; returns the head."""
    head = find_head(model)
    if hasattr(head.forward, "__wrapped__"):
        return head
    plain = head.forward

    def run(x):
        if not torch.is_grad_enabled():
            return plain(x)
        out = x.as_subclass(HeadInput)  # the same storage and autograd history
        out.head, out.chunk = head, chunk
        return out
    run.__wrapped__ = plain
    head.forward = run  # an instance attribute: nn.Module.__call__ finds it
    return head


def _autocast_state(device_type: str):
    on = torch.is_autocast_enabled(device_type)
    return on, torch.get_autocast_dtype(device_type) if on else None


def _logits(h, w, b, cast):
    on, dtype = cast
    with torch.autocast(h.device.type, dtype=dtype or torch.float32, enabled=on):
        z = F.linear(h, w, b)
    return z.float()  # fp32 softmax, as SequenceTask.loss does under autocast


class _ChunkedCE(torch.autograd.Function):
    """Per-token losses [N] of `linear(h, w, b)` against `y`; logits recomputed chunk by chunk in backward."""

    @staticmethod
    def forward(ctx, h, w, b, y, chunk: int, cast):
        n = h.shape[0]
        losses = torch.empty(n, dtype=torch.float32, device=h.device)
        lse = torch.empty(n, dtype=torch.float32, device=h.device)
        for s in range(0, n, chunk):
            z = _logits(h[s:s + chunk], w, b, cast)
            yc = y[s:s + chunk]
            keep = yc != IGNORE
            lse[s:s + chunk] = torch.logsumexp(z, dim=-1)
            picked = z.gather(1, torch.where(keep, yc, 0).unsqueeze(1)).squeeze(1)
            losses[s:s + chunk] = torch.where(keep, lse[s:s + chunk] - picked, 0.0)
            del z  # before the next chunk's logits exist: one chunk's alive at a time
        ctx.save_for_backward(h, w, b if b is not None else torch.empty(0), y, lse)
        ctx.chunk, ctx.cast, ctx.has_bias = chunk, cast, b is not None
        return losses

    @staticmethod
    def backward(ctx, grad):
        h, w, b, y, lse = ctx.saved_tensors
        b = b if ctx.has_bias else None
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        gh = torch.empty_like(h) if need_h else None
        gw = torch.zeros(w.shape, dtype=torch.float32, device=w.device) if need_w else None
        gb = torch.zeros(w.shape[0], dtype=torch.float32, device=w.device) if need_b and b is not None else None
        for s in range(0, h.shape[0], ctx.chunk):
            hc, yc = h[s:s + ctx.chunk], y[s:s + ctx.chunk]
            z = _logits(hc, w, b, ctx.cast)
            keep = yc != IGNORE
            g = z.sub_(lse[s:s + ctx.chunk].unsqueeze(1)).exp_()  # softmax, in place: one chunk's logits alive
            g.scatter_add_(1, torch.where(keep, yc, 0).unsqueeze(1), torch.full_like(z[:, :1], -1.0))
            g.mul_(torch.where(keep, grad[s:s + ctx.chunk], 0.0).unsqueeze(1))
            gz = g.to(hc.dtype) if not ctx.cast[0] else g.to(ctx.cast[1])  # the matmuls' dtype under autocast
            if need_h:
                gh[s:s + ctx.chunk] = (gz @ w.to(gz.dtype)).to(h.dtype)
            if need_w:
                gw += (gz.t() @ hc.to(gz.dtype)).float()
            if gb is not None:
                gb += g.sum(0)
            del z, g, gz
        return (gh, None if gw is None else gw.to(w.dtype), None if gb is None else gb.to(b.dtype),
                None, None, None)


def fused_loss(device_type: str, reduction: str) -> Optional[Callable]:
    """The fused linear cross-entropy `loss(weight, hidden, targets, bias)` to use instead of ecotrain's
    own: Liger Kernel's on CUDA for a mean or sum, when installed; None everywhere else."""
    if device_type != "cuda" or reduction not in ("mean", "sum"):
        return None
    liger = _liger_class()
    return None if liger is None else liger(ignore_index=IGNORE, reduction=reduction)


@functools.cache  # tried once per process: the line below is said once
def _liger_class():
    try:  # an optional extra: Liger Kernel's fused linear cross-entropy (Triton, CUDA only)
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
    except ImportError:
        log.info("memory.chunked_loss: Liger Kernel is not installed (pip install liger-kernel for its fused "
                 "linear cross-entropy on CUDA); ecotrain's own chunked loss runs instead")
        return None
    return LigerFusedLinearCrossEntropyLoss


def chunked_cross_entropy(hidden: HeadInput, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """`F.cross_entropy(head(hidden).flatten(0, 1), targets.reshape(-1), ignore_index=-100, reduction)`,
    without the whole logits."""
    head, chunk = hidden.head, hidden.chunk
    h = hidden.as_subclass(torch.Tensor).flatten(0, -2)
    y = targets.reshape(-1).to(h.device)
    fused = fused_loss(h.device.type, reduction)
    if fused is not None:  # CUDA only: not run here (no GPU)
        return fused(head.weight, h, y, head.bias)
    losses = _ChunkedCE.apply(h, head.weight, head.bias, y, chunk, _autocast_state(h.device.type))
    if reduction == "none":
        return losses
    total = losses.sum()
    if reduction == "sum":
        return total
    return total / (y != IGNORE).sum()  # mean over the tokens that count, as F.cross_entropy's


def applies(model: nn.Module, task, methods=None) -> bool:
    """Whether `memory.chunked_loss: on` can serve this model and task (what memory.budget asks before
    making it a candidate)."""
    try:
        find_head(model)
        check_task(task, methods)
    except ConfigError:
        return False
    return True


def check_task(task, methods) -> None:
    """The chunked loss replaces the logits only for ecotrain's own per-token cross-entropy; anything
    else reading the outputs would get the hidden states: one line instead."""
    if getattr(task, "name", None) not in ("sequence", "language_model"):
        raise ConfigError(f"memory.chunked_loss=on needs task language_model or sequence (ecotrain computes the "
                          f"cross-entropy), not {getattr(task, 'name', type(task).__name__)}; set memory.chunked_loss=off")
    if getattr(methods, "has_loss_terms", False):
        raise ConfigError("memory.chunked_loss=on: a method adds loss terms that read the logits; "
                          "set memory.chunked_loss=off")
