"""Activation offload: the tensors a block saves for backward go to host memory or a file, and come
back when the backward needs them (`torch.autograd.graph.saved_tensors_hooks`).

`apply_offload` replaces the chosen blocks' `forward` on the instance (as checkpointing does: no
wrapper module, same state_dict keys) with one that runs under the hooks of an `Offloader`:

- CUDA: each saved storage is copied to pinned host memory on a side stream (the compute stream
  goes on), and copied back on the compute stream when the backward unpacks it.
- CPU: each saved storage is written to one file in the run folder (opened and unlinked at once, so
  nothing is left behind) with `pwrite`, and read back with `preadv` into a fresh tensor. Plain
  writes, not a memory mapping: a mapped file's resident pages count in the process's RSS (the
  figure memory.budget measures on CPU) for as long as they are mapped, while written pages sit in
  the kernel's page cache, which it writes back and evicts under pressure. The write offset returns
  to 0 whenever nothing is stored, so the file is as large as one step's activations.

Lossless by default: whole storages are stored byte for byte and restored with the same size,
strides and offset, so gradients are bit-identical (tests/unit/test_offload.py). `lossy=True`
(`memory.activation_offload: bf16`, only with `memory.allow_precision_change`) stores float32
storages as bfloat16: half the bytes, gradients no longer exact.

Not offloaded: parameters and other leaves that require grad (alive anyway), storages under
`MIN_BYTES` (a syscall or a copy costs more than they save), tensors on other devices.
`Tensor._version` (private; pinned by tests/unit/test_offload.py) tells a storage written in place
since it was stored from one that was not.
"""

from __future__ import annotations

import os
import weakref
from pathlib import Path
from typing import Callable, Optional

import torch
from torch import nn

MIN_BYTES = 64 << 10
ALIGN = 4096  # page-aligned records: the page cache is filled and read in whole pages


class _Stored:
    """One offloaded storage; what autograd keeps instead of the tensor. Freed with the graph."""

    __slots__ = ("where", "nbytes", "dtype", "device", "lossy", "store", "__weakref__")

    def __init__(self, store, where, nbytes: int, dtype, device, lossy: bool):
        self.store, self.where, self.nbytes, self.dtype, self.device, self.lossy = \
            store, where, nbytes, dtype, device, lossy
        store.live += 1

    def __del__(self):
        self.store.release()


class _View:
    """A saved tensor as a view (size, stride, offset) of an offloaded storage."""

    __slots__ = ("stored", "size", "stride", "offset", "dtype")

    def __init__(self, stored: _Stored, t: torch.Tensor):
        self.stored, self.size, self.stride, self.offset, self.dtype = \
            stored, t.size(), t.stride(), t.storage_offset(), t.dtype


class FileStore:
    """CPU: storages written to one unlinked file in `folder`."""

    def __init__(self, folder: Path):
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f".activations-{os.getpid()}-{id(self):x}.offload"
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.unlink(path)  # the open descriptor keeps the data; the kernel frees it when the process ends
        weakref.finalize(self, os.close, self.fd)
        self.end = 0
        self.live = 0

    def release(self) -> None:
        self.live -= 1
        if self.live == 0:
            self.end = 0  # nothing stored: the next step overwrites the same pages

    def put(self, data: torch.Tensor) -> int:
        """Write the bytes of a contiguous CPU tensor; returns their offset."""
        at = self.end
        view = memoryview(data.view(torch.uint8).numpy()).cast("B")
        done = 0
        while done < len(view):  # one pwrite moves at most ~2 GiB
            done += os.pwrite(self.fd, view[done:], at + done)
        self.end = at + -(-len(view) // ALIGN) * ALIGN
        return at

    def get(self, at: int, nbytes: int) -> torch.Tensor:
        out = torch.empty(nbytes, dtype=torch.uint8)
        view = memoryview(out.numpy()).cast("B")
        done = 0
        while done < nbytes:
            n = os.preadv(self.fd, [view[done:]], at + done)
            if n == 0:
                raise RuntimeError("activation offload: the file ended before a stored activation")
            done += n
        return out


class PinnedStore:
    """CUDA: storages copied to pinned host memory on a side stream."""

    def __init__(self, device: torch.device):
        self.device, self.stream = device, torch.cuda.Stream(device)
        self.live = 0

    def release(self) -> None:
        self.live -= 1

    def put(self, data: torch.Tensor):
        host = torch.empty(data.shape, dtype=data.dtype, pin_memory=True)
        self.stream.wait_stream(torch.cuda.current_stream(data.device))  # the activation is written
        with torch.cuda.stream(self.stream):
            host.copy_(data, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.stream)
        data.record_stream(self.stream)  # the allocator must not reuse it before the copy ends
        return host, done

    def get(self, where, nbytes: int) -> torch.Tensor:
        host, done = where
        torch.cuda.current_stream().wait_event(done)
        return host.to(self.device, non_blocking=True)


class Offloader:
    """The pack/unpack pair of `saved_tensors_hooks` for one model; `hooks()` is the context."""

    def __init__(self, folder: Optional[Path], lossy: bool = False, min_bytes: int = MIN_BYTES):
        self.folder, self.lossy, self.min_bytes = folder, lossy, min_bytes
        self.stores: dict = {}
        self.params: set[int] = set()
        self.recent: dict[int, tuple] = {}  # storage pointer -> (weakref of a packed tensor, its version, of its _Stored)
        self.bytes_offloaded = 0  # over the process (for tests and the bench)

    def store(self, device: torch.device):
        if device not in self.stores:
            self.stores[device] = (FileStore(self.folder) if device.type == "cpu" else PinnedStore(device))
        return self.stores[device]

    def pack(self, t: torch.Tensor):
        dev = t.device
        if dev.type not in ("cpu", "cuda") or (t.requires_grad and t.is_leaf) or t.is_sparse:
            return t
        storage = t.untyped_storage()
        ptr, nbytes = storage.data_ptr(), storage.nbytes()
        if nbytes < self.min_bytes or ptr in self.params:
            return t
        hit = self.recent.get(ptr)
        # a live tensor on this storage proves it was not freed and reused, and an unchanged version
        # counter (shared by views) that it was not written in place since: views share one record
        stored = hit[2]() if hit is not None and hit[0]() is not None and hit[1] == t._version else None
        if stored is None:
            raw = torch.empty(0, dtype=torch.uint8, device=dev).set_(storage)
            lossy = self.lossy and t.dtype == torch.float32 and nbytes % 4 == 0
            data = raw.view(torch.float32).to(torch.bfloat16) if lossy else raw
            stored = _Stored(self.store(dev), self.store(dev).put(data), nbytes, t.dtype, dev, lossy)
            self.recent[ptr] = (weakref.ref(t), t._version, weakref.ref(stored))  # weak: autograd owns the record
            self.bytes_offloaded += nbytes
        return _View(stored, t)

    def unpack(self, packed):
        if not isinstance(packed, _View):
            return packed
        s = packed.stored
        stored_bytes = s.nbytes // 2 if s.lossy else s.nbytes
        raw = s.store.get(s.where, stored_bytes)
        if s.lossy:
            raw = raw.view(torch.bfloat16).float().view(torch.uint8)
        return torch.empty(0, dtype=packed.dtype, device=raw.device).set_(
            raw.untyped_storage(), packed.offset, packed.size, packed.stride)

    def hooks(self, module: nn.Module):
        # weights are alive anyway (and updated in place): never written out
        self.params = {p.untyped_storage().data_ptr() for p in module.parameters()}
        self.recent.clear()
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)


def _offloaded(forward: Callable, module: nn.Module, offloader: Offloader) -> Callable:
    def run(*args, **kwargs):
        if not torch.is_grad_enabled():  # eval / inference: nothing is saved
            return forward(*args, **kwargs)
        with offloader.hooks(module):
            return forward(*args, **kwargs)
    run.__wrapped__ = forward
    run.__offloaded__ = offloader
    return run


def apply_offload(modules: list[tuple[str, nn.Module]], folder: Optional[Path], lossy: bool = False,
                  min_bytes: int = MIN_BYTES) -> Offloader:
    """Offload the saved activations of `modules` (name, module), in place; returns the Offloader."""
    offloader = Offloader(folder, lossy, min_bytes)
    for _, mod in modules:
        if not hasattr(mod.forward, "__wrapped__"):  # a checkpointed block saves nothing to offload
            mod.forward = _offloaded(mod.forward, mod, offloader)
    return offloader
