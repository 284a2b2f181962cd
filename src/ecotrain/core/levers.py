"""Memory levers: activation checkpointing of a model's blocks and recovery from out-of-memory steps.

Checkpointing replaces a block's `forward` on the instance with one that runs it under
`torch.utils.checkpoint` (non-reentrant): the module, its class and its state_dict keys stay the
same (no wrapper module, no `__getattr__` proxy), and gradients are exactly those of the plain
model because the recomputation replays the same RNG and autocast state. It is selective, per op
(core/selective.py, `memory.checkpoint_policy`): `attention` keeps the fused attention kernels'
outputs and recomputes the rest; `matmuls` keeps every matmul output and recomputes pointwise ops.
Activation offload (core/offload.py, `memory.activation_offload`) moves the saved tensors of the
blocks not checkpointed to host memory or a file.

OOM recovery doubles the number of micro-batches of the effective batch: the micro-batch halves,
the accumulation doubles, and the loss normalisation (task.normalized_loss) keeps the maths of
the step unchanged. The count lives in `state.plan` (stepplan.py), whose one writer at run time this is; a checkpoint carries it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fnmatch
import gc
import json
import tempfile
import traceback
from pathlib import Path
from typing import Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ecotrain.base import safefile
from ecotrain.core.batch import batch_size
from ecotrain.base.log import log
from ecotrain.base.errors import ConfigError, EcotrainError
from ecotrain.core.chunked_loss import apply_chunked_loss
from ecotrain.core.offload import apply_offload
from ecotrain.core.selective import ATTENTION_OPS, context_fn  # noqa: F401 (ATTENTION_OPS re-exported)
from ecotrain.base.rundir import atomic_write
from ecotrain.base.runfiles import MICRO_BATCHES


# cuBLAS and cuDNN report a failed allocation as a plain RuntimeError, not torch.OutOfMemoryError
ALLOC_FAILED = ("CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED", "CUDA out of memory")


def is_oom(exc: BaseException) -> bool:
    """An out-of-memory error of any origin: torch's allocator, or cuBLAS/cuDNN's own workspace."""
    return isinstance(exc, torch.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and any(m in str(exc) for m in ALLOC_FAILED))


class OutOfMemory(EcotrainError):
    """A step ran out of memory even at the smallest micro-batch allowed."""


# ---------------------------------------------------------------- activation checkpointing


def find_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The model's repeated blocks: the children of its longest ModuleList (or Sequential of two or
    more) whose children all share one class (a transformer's layers, a ResNet's stages)."""
    best: list[tuple[str, nn.Module]] = []
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and len(mod) or isinstance(mod, nn.Sequential) and len(mod) >= 2:
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


def _checkpointed(forward: Callable, policy: str) -> Callable:
    make_contexts = context_fn(policy)

    def run(*args, **kwargs):
        if not torch.is_grad_enabled():  # eval / inference: nothing would be saved anyway
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, context_fn=make_contexts, **kwargs)
    run.__wrapped__ = forward
    return run


def apply_activation_checkpointing(model: nn.Module, spec, policy: str = "attention") -> list[str]:
    """Checkpoint the modules `spec` selects, in place, keeping what `policy` keeps (core/selective.py);
    returns their names."""
    chosen = select_modules(model, spec)
    for _, mod in chosen:
        if not hasattr(mod.forward, "__wrapped__"):
            mod.forward = _checkpointed(mod.forward, policy)  # an instance attribute: nn.Module.__call__ finds it
    return [n for n, _ in chosen]


def offload_targets(model: nn.Module, checkpointed: list[str]) -> list[tuple[str, nn.Module]]:
    """The modules activation offload wraps: the blocks not checkpointed (a checkpointed block keeps only
    its input), or the whole model when it has no repeated blocks and nothing is checkpointed."""
    blocks = find_blocks(model)
    if not blocks:
        return [] if checkpointed else [("", model)]
    return [(n, m) for n, m in blocks if n not in checkpointed
            and not any(n.startswith(c + ".") or c.startswith(n + ".") for c in checkpointed)]


def release_freed_memory(threshold: int = 1 << 20) -> bool:
    """glibc only: serve allocations >= `threshold` bytes by mmap, so a freed tensor goes straight back
    to the OS. By default glibc raises its mmap threshold to 32 MiB after the first big free and keeps
    freed blocks below that in its heap: under checkpointing's interleaved recompute/backward that
    retained heap is ~0.5 GB of RSS at T=2048 (docs/memory.md). Process-wide; False where not glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(-3, threshold))  # -3: M_MMAP_THRESHOLD (also stops its dynamic growth)
    except (OSError, AttributeError):
        return False


def configure_memory(model: nn.Module, cfg) -> list[str]:
    """Apply the `memory` config section to a built model; returns the checkpointed modules' names."""
    if cfg.release_freed:
        release_freed_memory()
    names = apply_activation_checkpointing(model, cfg.activation_checkpointing, cfg.checkpoint_policy)
    if cfg.activation_offload != "off":  # the file goes to the run folder (memory.measure.for_run sets it)
        folder = Path(cfg.offload_dir) if cfg.offload_dir else Path(tempfile.gettempdir())
        targets = offload_targets(model, names)[:cfg.offload_blocks]  # None: every one
        apply_offload(targets, folder, lossy=cfg.activation_offload == "bf16")
    if cfg.chunked_loss == "on":  # after checkpointing: the head is not a block
        apply_chunked_loss(model, cfg.loss_chunk)
    return names


# ---------------------------------------------------------------- OOM recovery


def write_oom_hint(run_dir, micro_batches: int, step: int, rank: int) -> None:
    if run_dir is None:
        return
    path = Path(run_dir) / OOM_HINT
    micro_batches = max(micro_batches, oom_hint(run_dir) or 0)  # two ranks at once: the larger count
    atomic_write(path, json.dumps({"micro_batches": micro_batches, "step": step, "rank": rank}).encode())


def oom_hint(run_dir) -> int | None:
    """The micro-batch count a rank's OOM asked every rank to resume with (None: none asked)."""
    try:
        n = safefile.read_json(Path(run_dir) / OOM_HINT, "OOM hint", 64 * safefile.MiB).get("micro_batches")
    except (OSError, ValueError, AttributeError, ConfigError):
        return None
    return n if isinstance(n, int) and n > 0 else None


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


OOM_HINT = MICRO_BATCHES  # a rank's OOM under torchrun: the count every rank resumes with


def recover_from_oom(state, batch, n_micro: int, exc: BaseException, run: Callable):
    """Retry the step `run(state, batch, n)` with twice the micro-batches until it fits.

    Gradients of the failed attempt are dropped, so the retried step is the same step. Under torchrun
    one rank cannot retry alone: the others are inside the step's collectives (DDP's reducer is half
    done, FSDP's all-gathers would not match). The rank writes the doubled count to the run folder and
    stops with one line; the job restarts (torchrun's --max-restarts, or the user's --resume auto) and
    every rank resumes with that count, the same on all (`oom_hint`)."""
    min_size = state.config.memory.min_micro_batch
    total = batch_size(batch)
    if state.dist.world_size > 1:
        traceback.clear_frames(exc.__traceback__)
        new_n = n_micro * 2
        if -(-total // new_n) < min_size:
            raise OutOfMemory(f"rank {state.dist.rank}: out of memory at step {state.step + 1} with {n_micro} "
                              f"micro-batches and memory.min_micro_batch={min_size}; lower data.batch_size or "
                              "add ranks (see `ecotrain plan`)")
        write_oom_hint(state.run_dir, new_n, state.step + 1, state.dist.rank)
        raise OutOfMemory(f"rank {state.dist.rank}: out of memory at step {state.step + 1}; every rank continues "
                          f"with {new_n} micro-batches (was {n_micro}) from the newest checkpoint when the job "
                          "restarts (torchrun --max-restarts does it; else rerun with --resume auto)")
    while True:
        traceback.clear_frames(exc.__traceback__)  # the failed attempt's frames hold its activations
        exc = None
        state.optimizer.zero_grad(set_to_none=True)
        free_memory()
        size = -(-total // n_micro)
        new_n = n_micro * 2
        new_size = -(-total // new_n)
        if new_size < min_size or new_size == size:
            raise OutOfMemory(
                f"out of memory at step {state.step + 1} with micro-batch {size} (batch {total} in {n_micro} "
                f"micro-batches) and memory.min_micro_batch={min_size}; lower data.batch_size, set "
                "memory.activation_checkpointing=all or precision=bf16-mixed (see `ecotrain plan`)")
        log.warning(f"out of memory at step {state.step + 1}; micro-batch {size} -> {new_size} "
              f"({n_micro} -> {new_n} micro-batches, effective batch {total} unchanged)")
        state.plan.raise_micro_batches(new_n)
        n_micro = new_n
        state.counters.oom_recoveries += 1
        try:
            return run(state, batch, n_micro)
        except (torch.OutOfMemoryError, RuntimeError) as again:
            if not is_oom(again):
                raise
            exc = again
