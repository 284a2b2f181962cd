"""A batch is any structure: a tensor, a tuple or list, a dict (a Hugging Face `BatchEncoding`
included), a dataclass or a namedtuple, nested. This module is the one place that walks one:
`tree_map` over its tensors, moving it to a device, its sample count, and cutting it into
micro-batches along the first dimension. Leaves that are not tensors (strings, ids, metadata)
ride along untouched; lists of them are cut with the tensors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Callable

import torch


class MicroBatches(list):
    """An effective batch already in pieces: `loop.accumulate` batches of a user's DataLoader."""


def tree_map(fn: Callable[[torch.Tensor], Any], batch: Any) -> Any:
    """`batch` with `fn` applied to every tensor leaf, the containers rebuilt as they were."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, tuple):
        items = [tree_map(fn, v) for v in batch]
        return type(batch)(*items) if hasattr(batch, "_fields") else tuple(items)  # namedtuple
    if isinstance(batch, list):
        return [tree_map(fn, v) for v in batch]
    if isinstance(batch, Mapping):
        items = {k: tree_map(fn, v) for k, v in batch.items()}
        if type(batch) is dict:
            return items
        try:  # a dict subclass (BatchEncoding) keeps its class, so `.input_ids` still works
            return type(batch)(items)
        except TypeError:
            return items
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return dataclasses.replace(batch, **{f.name: tree_map(fn, getattr(batch, f.name))
                                             for f in dataclasses.fields(batch) if f.init})
    return batch


def leaves(batch: Any) -> list[torch.Tensor]:
    """The tensor leaves of `batch`, in order."""
    out: list[torch.Tensor] = []
    tree_map(lambda t: out.append(t), batch)
    return out


def to_device(batch: Any, device: torch.device, non_blocking: bool = True) -> Any:
    if type(batch) is tuple and len(batch) == 2 and type(batch[0]) is torch.Tensor \
            and type(batch[1]) is torch.Tensor:  # the common (x, y): no tree walk (not a namedtuple)
        return batch[0].to(device, non_blocking=non_blocking), batch[1].to(device, non_blocking=non_blocking)
    return tree_map(lambda t: t.to(device, non_blocking=non_blocking), batch)


def batch_size(batch: Any) -> int:
    """Samples in `batch`: the first dimension of its first tensor leaf (MicroBatches: of every piece)."""
    if isinstance(batch, MicroBatches):
        return sum(batch_size(p) for p in batch)
    if isinstance(batch, tuple) and batch and isinstance(batch[0], torch.Tensor):
        return batch[0].shape[0]
    for t in leaves(batch):
        if t.ndim:
            return t.shape[0]
    raise TypeError(f"a batch of {type(batch).__name__} holds no tensor with a batch dimension")


def _cut(value: Any, size: int, n: int) -> list:
    """`value` cut into `n` pieces of `size` along the first dimension (a list: `n` copies of a leaf
    that is not batched, such as a scalar or a string)."""
    if isinstance(value, torch.Tensor):
        return list(value.split(size)) if value.ndim else [value] * n
    if isinstance(value, tuple):
        cols = [_cut(v, size, n) for v in value]
        rows = [[c[i] for c in cols] for i in range(n)]
        return [type(value)(*r) if hasattr(value, "_fields") else tuple(r) for r in rows]
    if isinstance(value, Mapping):
        cols = {k: _cut(v, size, n) for k, v in value.items()}
        return [_rebuild_mapping(value, {k: c[i] for k, c in cols.items()}) for i in range(n)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        cols = {f.name: _cut(getattr(value, f.name), size, n) for f in dataclasses.fields(value) if f.init}
        return [dataclasses.replace(value, **{k: c[i] for k, c in cols.items()}) for i in range(n)]
    if isinstance(value, list) and all(not isinstance(v, (torch.Tensor, Mapping, tuple, list)) for v in value):
        return [value[i * size:(i + 1) * size] for i in range(n)]  # per-sample metadata
    if isinstance(value, list):
        cols = [_cut(v, size, n) for v in value]
        return [[c[i] for c in cols] for i in range(n)]
    return [value] * n


def _rebuild_mapping(like: Mapping, items: dict) -> Any:
    if type(like) is dict:
        return items
    try:
        return type(like)(items)
    except TypeError:
        return items


def split(batch: Any, n_micro: int) -> list:
    """`batch` in micro-batches of at most ceil(samples / n_micro) samples each (the last may be
    smaller, and there may be fewer than `n_micro` of them: 9 samples in 4 make 3 pieces of 3)."""
    total = batch_size(batch)
    size = -(-total // n_micro)  # ceil
    n = -(-total // size)
    if type(batch) is tuple and len(batch) == 2 and type(batch[0]) is torch.Tensor \
            and type(batch[1]) is torch.Tensor:
        return list(zip(batch[0].split(size), batch[1].split(size)))
    return _cut(batch, size, n)


def select(batch: Any, idx: torch.Tensor) -> Any:
    """The samples `idx` of `batch` (per-sample lists are indexed too)."""
    n = batch_size(batch)

    def pick(value):
        if isinstance(value, torch.Tensor):
            return value.index_select(0, idx.to(value.device)) if value.ndim and value.shape[0] == n else value
        if isinstance(value, list) and len(value) == n and all(not isinstance(v, torch.Tensor) for v in value):
            return [value[i] for i in idx.tolist()]
        if isinstance(value, tuple):
            items = [pick(v) for v in value]
            return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
        if isinstance(value, list):
            return [pick(v) for v in value]
        if isinstance(value, Mapping):
            return _rebuild_mapping(value, {k: pick(v) for k, v in value.items()})
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return dataclasses.replace(value, **{f.name: pick(getattr(value, f.name))
                                                 for f in dataclasses.fields(value) if f.init})
        return value
    return pick(batch)


def describe(batch: Any, depth: int = 0) -> str:
    """A short shape of `batch` for error messages: `dict(input_ids: int64[8, 16], labels: int64[8])`."""
    if isinstance(batch, torch.Tensor):
        return f"{str(batch.dtype).removeprefix('torch.')}{list(batch.shape)}"
    if depth > 2:
        return type(batch).__name__
    if isinstance(batch, Mapping):
        return f"{type(batch).__name__}(" + ", ".join(f"{k}: {describe(v, depth + 1)}" for k, v in
                                                      list(batch.items())[:6]) + ")"
    if isinstance(batch, (tuple, list)):
        return f"{type(batch).__name__}(" + ", ".join(describe(v, depth + 1) for v in batch[:6]) + ")"
    return type(batch).__name__


def iter_batches(source, batch_size: int):
    """A split in order, as batches (evaluation): a source's own order where it has one (`in_order`: a
    user's loader), contiguous views of in-memory arrays (`take_range`), else `take` over consecutive
    indices. Any object with `take` and `len` is a source here: the engine names no data class."""
    in_order = getattr(source, "in_order", None)
    if in_order is not None:
        yield from in_order(batch_size)
        return
    take_range = getattr(source, "take_range", None)
    n = len(source)
    for start in range(0, n, batch_size):
        stop = min(start + batch_size, n)
        yield take_range(start, stop) if take_range else source.take(torch.arange(start, stop))
