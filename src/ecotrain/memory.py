"""Memory levers: activation checkpointing of a model's blocks and recovery from out-of-memory steps.

Checkpointing replaces a block's `forward` on the instance with one that runs it under
`torch.utils.checkpoint` (non-reentrant): the module, its class and its state_dict keys stay the
same (no wrapper module, no `__getattr__` proxy), and gradients are exactly those of the plain
model because the recomputation replays the same RNG and autocast state.

OOM recovery doubles the number of micro-batches of the effective batch: the micro-batch halves,
the accumulation doubles, and the loss normalisation (task.normalized_loss) keeps the maths of
the step unchanged. The count lives in `state.extra["micro_batches"]` so a checkpoint carries it.
"""

from __future__ import annotations

import fnmatch
import gc
import sys
import traceback
from typing import Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ecotrain.errors import ConfigError, EcotrainError


class OutOfMemory(EcotrainError):
    """A step ran out of memory even at the smallest micro-batch allowed."""


# ---------------------------------------------------------------- activation checkpointing


def find_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The model's repeated blocks: the children of its longest ModuleList/Sequential whose
    children all share one class (a transformer's layers, a ResNet's stages)."""
    best: list[tuple[str, nn.Module]] = []
    for name, mod in model.named_modules():
        if isinstance(mod, (nn.ModuleList, nn.Sequential)) and len(mod) >= 2:
            kids = list(mod.named_children())
            if len({type(m) for _, m in kids}) == 1 and any(True for _ in kids[0][1].parameters()) \
                    and len(kids) > len(best):
                best = [(f"{name}.{k}" if name else k, m) for k, m in kids]
    return best


def select_modules(model: nn.Module, spec) -> list[tuple[str, nn.Module]]:
    """The modules `memory.activation_checkpointing` names: 'off', 'all' (every block),
    {'every_n': K} (blocks 0, K, 2K, ...) or {'modules': [qualified-name globs or class names]}."""
    if spec in (None, "off"):
        return []
    if spec == "all" or hasattr(spec, "every_n"):
        blocks = find_blocks(model)
        if not blocks:
            raise ConfigError("memory.activation_checkpointing: the model has no repeated blocks "
                              "(a ModuleList/Sequential of same-class modules); name them with {modules: [...]}")
        k = 1 if spec == "all" else spec.every_n
        return blocks[::k]
    chosen = [(n, m) for n, m in model.named_modules() if n and any(
        fnmatch.fnmatchcase(n, pat) or type(m).__name__ == pat for pat in spec.modules)]
    if not chosen:
        raise ConfigError(f"memory.activation_checkpointing.modules: {spec.modules} match no module "
                          f"(blocks found: {[n for n, _ in find_blocks(model)][:8]})")
    # a module inside an already-chosen one would be recomputed twice: keep the outermost
    return [(n, m) for n, m in chosen if not any(n.startswith(o + ".") for o, _ in chosen)]


def _checkpointed(forward: Callable) -> Callable:
    def run(*args, **kwargs):
        if not torch.is_grad_enabled():  # eval / inference: nothing would be saved anyway
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)
    run.__wrapped__ = forward
    return run


def apply_activation_checkpointing(model: nn.Module, spec) -> list[str]:
    """Checkpoint the modules `spec` selects, in place; returns their names."""
    chosen = select_modules(model, spec)
    for _, mod in chosen:
        if not hasattr(mod.forward, "__wrapped__"):
            mod.forward = _checkpointed(mod.forward)  # an instance attribute: nn.Module.__call__ finds it
    return [n for n, _ in chosen]


# ---------------------------------------------------------------- OOM recovery


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def recover_from_oom(state, x, y, n_micro: int, exc: BaseException, run: Callable):
    """Retry the step `run(state, x, y, n)` with twice the micro-batches until it fits.

    Gradients of the failed attempt are dropped, so the retried step is the same step."""
    min_size = state.config.memory.min_micro_batch
    while True:
        traceback.clear_frames(exc.__traceback__)  # the failed attempt's frames hold its activations
        exc = None
        state.optimizer.zero_grad(set_to_none=True)
        free_memory()
        size = -(-len(y) // n_micro)
        new_n = n_micro * 2
        new_size = -(-len(y) // new_n)
        if new_size < min_size or new_size == size:
            raise OutOfMemory(
                f"out of memory at step {state.step + 1} with micro-batch {size} (batch {len(y)} in {n_micro} "
                f"micro-batches) and memory.min_micro_batch={min_size}; lower data.batch_size, set "
                "memory.activation_checkpointing=all or precision=bf16-mixed (see `ecotrain plan`)")
        print(f"ecotrain: warning: out of memory at step {state.step + 1}; micro-batch {size} -> {new_size} "
              f"({n_micro} -> {new_n} micro-batches, effective batch {len(y)} unchanged)", file=sys.stderr)
        state.extra["micro_batches"] = n_micro = new_n
        state.extra["oom_recoveries"] = state.extra.get("oom_recoveries", 0) + 1
        try:
            return run(state, x, y, n_micro)
        except torch.OutOfMemoryError as again:
            exc = again
