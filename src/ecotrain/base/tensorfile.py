"""The one writer and reader of ecotrain's `.safetensors` files (checkpoints, model.safetensors,
export.safetensors, replay buffers, adapters, features): shared tensors stored once.

safetensors refuses two names for one memory ("Some tensors share memory"), and every Hugging Face
causal LM ties `lm_head.weight` to its input embedding. So a tensor that is exactly another one (same
storage, offset, shape, strides, dtype) is written once and its other names are recorded in the
file's metadata (`ecotrain.aliases`: {alias: stored name}); reading gives the aliases back as the very
same tensor object, so tied weights come back tied. A tensor that only overlaps another (a slice of
it) is written as its own copy. Files without the metadata (anyone's safetensors) read as they are.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save, save_file

from ecotrain.base import safefile
from ecotrain.base.errors import CheckpointError
from ecotrain.base.rundir import atomic_write
from ecotrain.base.fsnames import native_name

ALIASES = "ecotrain.aliases"


def split_aliases(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors to store, on the CPU and contiguous; {alias: stored name}): each memory stored under its
    first name. Found before the copy to the CPU, so tied weights on a GPU are stored once too."""
    stored: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple, str] = {}  # (storage pointer, device) -> first name stored there
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor) or t.numel() == 0:  # safetensors says what is wrong with a non-tensor
            stored[name] = t
            continue
        key = (t.untyped_storage().data_ptr(), str(t.device))
        first = seen.get(key)
        if first is None:
            seen[key] = name
            stored[name] = t
        elif _same_view(stored[first], t):
            aliases[name] = first
        else:  # overlapping, not identical: its own bytes
            stored[name] = t.clone()
    return {k: v.detach().cpu().contiguous() if isinstance(v, torch.Tensor) else v for k, v in stored.items()}, aliases


def cpu_copy(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A detached CPU copy of a state_dict in which names tied in `state` stay one tensor (best weights,
    the previous model of weight averaging, a candidate's weights): stored once, loaded tied."""
    out: dict[str, torch.Tensor] = {}
    seen: dict[tuple, str] = {}
    for name, t in state.items():
        if type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter):  # FSDP's DTensors: no storage
            out[name] = t.detach().to("cpu", copy=True)
            continue
        key = (t.untyped_storage().data_ptr(), str(t.device), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        first = seen.get(key) if t.numel() else None
        out[name] = out[first] if first is not None else t.detach().to("cpu", copy=True)
        seen.setdefault(key, name)
    return out


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
            and a.storage_offset() == b.storage_offset())


def _metadata(aliases: dict[str, str], metadata: dict[str, str] | None) -> dict[str, str] | None:
    meta = dict(metadata or {})
    if aliases:
        meta[ALIASES] = json.dumps(aliases, sort_keys=True)
    return meta or None


def tensors_bytes(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> bytes:
    """The safetensors file of `tensors` in memory (for an atomic write by the caller)."""
    stored, aliases = split_aliases(tensors)
    return save(stored, metadata=_metadata(aliases, metadata))


def write_tensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    """Write `tensors` to `path` (safetensors' Rust writer, mostly outside the GIL), fsynced."""
    stored, aliases = split_aliases(tensors)
    try:
        os.fspath(path).encode("utf-8")
    except UnicodeEncodeError:  # a folder name that is not UTF-8: safetensors' writer takes str only
        with open(path, "wb") as f:
            f.write(save(stored, metadata=_metadata(aliases, metadata)))
    else:
        save_file(stored, str(path), metadata=_metadata(aliases, metadata))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def aliases_of(path: Path, what: str | None = None) -> dict[str, str]:
    """{alias: stored name} recorded in a safetensors file; {} when none. Checked: names are strings,
    every target is stored, no alias shadows a stored name."""
    regular = safefile.regular(path, "safetensors file", error=CheckpointError, fix="")  # no FIFO, no device
    with native_name(regular) as name, safe_open(name, framework="pt") as f:  # a run folder's name may not be UTF-8
        keys = set(f.keys())
        raw = (f.metadata() or {}).get(ALIASES)
    if raw is None:
        return {}
    try:
        aliases = json.loads(raw)
    except (ValueError, RecursionError):
        aliases = None
    if not isinstance(aliases, dict) or not all(isinstance(k, str) and isinstance(v, str) and v in keys
                                                and k not in keys for k, v in aliases.items()):
        raise CheckpointError(f"{what or path}: its '{ALIASES}' metadata is damaged (each alias must name a "
                              "stored tensor)")
    return aliases


def read_tensors(path: Path, what: str | None = None) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file, aliases restored as the same tensor objects."""
    aliases = aliases_of(path, what)
    with native_name(safefile.regular(path, "safetensors file", error=CheckpointError, fix="")) as name:
        tensors = load_file(name)
    for alias, target in aliases.items():
        tensors[alias] = tensors[target]
    return tensors


def save_weights(path: Path, model_or_sd) -> None:
    """A model's (or a state_dict's) tensors as one `.safetensors` file, written atomically: the final
    weights (finish), a registry version's or a feedback round's model."""
    sd = model_or_sd.state_dict() if isinstance(model_or_sd, torch.nn.Module) else model_or_sd
    atomic_write(path, tensors_bytes(dict(sd)))  # tied weights stored once, restored tied
