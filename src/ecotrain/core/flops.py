"""FLOPs of one real training step, counted exactly by `torch.utils.flop_counter.FlopCounterMode`.

The count covers the ops PyTorch's counter knows (matmuls, convolutions, attention), forward and
backward; elementwise ops, norms and the optimizer step are not counted, as in every FLOPs
convention. PyTorch counts its CUDA attention kernels but not the CPU one that
`F.scaled_dot_product_attention` runs (`_scaled_dot_product_flash_attention_for_cpu`): a CPU
transformer's attention counted 0. This module registers that kernel's formula with the public
`register_flop_formula`, the same matmuls PyTorch counts for the CUDA kernels (GQA: per query head),
so every FlopCounterMode in the process (the ledger's, the methods') counts CPU attention too. The forward share is read by a forward pre-/post-hook pair on the model, so evaluation
(a forward pass per sample) is accounted from the same measured step. The hooks and the counter live
for that one step only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, register_flop_formula


def attention_flops(q: tuple, k: tuple, v: tuple, backward: bool = False) -> int:
    """Matmul FLOPs of attention on shapes `[b, heads, s, d]`: forward Q K^T and P V; backward, as
    PyTorch counts its CUDA kernels, the scores recomputed and the gradients of P, V, Q and K."""
    b, h, s_q, d = q
    s_k, d_v = k[2], v[3]
    per = 2 * b * h * s_q * s_k
    return per * (3 * d + 2 * d_v) if backward else per * (d + d_v)


def _register_cpu_attention() -> None:
    aten = torch.ops.aten
    if not hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        return
    try:
        register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu)(
            lambda query, key, value, *args, out_shape=None, **kwargs: attention_flops(query, key, value))
        register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu_backward)(
            lambda grad_out, query, key, value, *args, out_shape=None, **kwargs:
            attention_flops(query, key, value, backward=True))
    except RuntimeError:  # "duplicate registrations": a later PyTorch counts the CPU kernel itself
        pass


_register_cpu_attention()


@dataclass
class StepFlops:
    total: int  # forward + backward of the measured step
    forward: int
    samples: int  # samples in the measured (effective) batch

    @property
    def per_sample(self) -> float:
        return self.total / self.samples

    @property
    def forward_per_sample(self) -> float:
        return self.forward / self.samples


class StepFlopCounter:
    """`start(model)` before a step's first forward, `stop(samples)` after its backward."""

    def __init__(self):
        self.mode: FlopCounterMode | None = None
        self._hooks: list = []
        self._forward = 0
        self._at_forward_start = 0

    @property
    def active(self) -> bool:
        return self.mode is not None

    def start(self, model: nn.Module) -> None:
        self.mode = FlopCounterMode(display=False)
        self._forward = 0

        def pre(_module, _args):
            self._at_forward_start = self.mode.get_total_flops()

        def post(_module, _args, _out):
            self._forward += self.mode.get_total_flops() - self._at_forward_start  # once per micro-batch

        self._hooks = [model.register_forward_pre_hook(pre), model.register_forward_hook(post)]
        self.mode.__enter__()

    def stop(self) -> tuple[int, int]:
        """(total, forward) FLOPs counted since `start`."""
        self.mode.__exit__(None, None, None)
        for h in self._hooks:
            h.remove()
        total, self.mode, self._hooks = self.mode.get_total_flops(), None, []
        return int(total), int(self._forward)


def count_flops(model: nn.Module, fn, samples: int) -> StepFlops:
    """Count `fn()` (e.g. a forward and backward of `model`); a helper for tests and notebooks."""
    counter = StepFlopCounter()
    counter.start(model)
    try:
        fn()
    finally:
        total, forward = counter.stop()
    return StepFlops(total, forward, samples)


_warm = False


def warm_up() -> None:
    """The counter's first use imports torch._dynamo (~1 s): pay that before the training clock starts."""
    global _warm
    if not _warm:
        with FlopCounterMode(display=False):
            torch.ones(1, 1) @ torch.ones(1, 1)
        _warm = True
