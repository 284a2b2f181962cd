"""What a checkpointed block keeps: the per-op policies of selective recompute.

`torch.utils.checkpoint` with `create_selective_checkpoint_contexts` asks a policy, op by op, whether
the op's output is saved in the forward or recomputed in the backward (core/levers.py applies it
per block). Two policies, `memory.checkpoint_policy`:

    attention  keep the fused attention kernels' outputs, recompute everything else (the whole block
               is replayed but attention's O(T^2) FLOPs): the most memory saved for ~1.15-1.3x step time
    matmuls    keep every matmul and attention output, recompute only the pointwise ops (norms,
               activations, dropout, residual adds): about half a block's activations saved for
               almost no recompute (torchtitan's per-op selective activation checkpointing)

Both replay the same ops on the same inputs (RNG and autocast state restored), so gradients are
bit-identical to the plain block's on CPU (tests/unit/test_selective.py).
"""

from __future__ import annotations

import functools

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

POLICIES = ("attention", "matmuls")


def _ops(*names: str) -> frozenset:
    # the kernels present in this torch build (the cuDNN / flash ones are CUDA-only names)
    return frozenset(getattr(torch.ops.aten, n).default for n in names if hasattr(torch.ops.aten, n))


ATTENTION_OPS = _ops("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
                     "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention")
MATMUL_OPS = ATTENTION_OPS | _ops("mm", "addmm", "bmm", "baddbmm", "_scaled_mm", "convolution",
                                  "_convolution", "mkldnn_convolution", "cudnn_convolution")


def _keep_attention(ctx, op, *args, **kwargs):
    # Attention is the costly part to recompute at long T (O(T^2) FLOPs) and its outputs are small
    # (O(T)): keep them, recompute the rest. Measured at T=2048: ~1.35x -> ~1.2x step time.
    return CheckpointPolicy.MUST_SAVE if op in ATTENTION_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _keep_matmuls(ctx, op, *args, **kwargs):
    # matmuls are nearly all of a block's FLOPs; pointwise ops are cheap to replay but their
    # outputs (layer-norm, GELU, dropout) are as large as the matmuls'
    return CheckpointPolicy.MUST_SAVE if op in MATMUL_OPS else CheckpointPolicy.PREFER_RECOMPUTE


_POLICY_FNS = {"attention": _keep_attention, "matmuls": _keep_matmuls}


def kept_ops(policy: str) -> frozenset:
    """The ops whose outputs a block checkpointed under `policy` keeps (memory/estimate.py counts them)."""
    return ATTENTION_OPS if policy == "attention" else MATMUL_OPS


def context_fn(policy: str):
    """The `context_fn` of `torch.utils.checkpoint` for `policy` (a fresh pair of contexts per call)."""
    return functools.partial(create_selective_checkpoint_contexts, _POLICY_FNS[policy])
