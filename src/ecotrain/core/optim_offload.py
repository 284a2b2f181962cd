"""Optimizer-state offload: between steps, the optimizer's state lives outside the training memory.

Adam keeps two float32 tensors per parameter: twice the parameters' bytes, alive through every
forward and backward although only the optimizer step reads them. `memory.optimizer_offload: on`
moves them out after each step and back before the next, through the optimizer's public hooks
(`register_step_pre_hook` / `register_step_post_hook`; no patched `step`):

- CPU: each state tensor is written to one file in the run folder (opened and unlinked at once,
  core/offload.py's `FileStore`: `pwrite`, no memory mapping, so the bytes leave the process's
  RSS for the page cache) and read back into a fresh tensor before the step. The step runs on the
  CPU, where it always did.
- CUDA: copied to pinned host memory (non-blocking, on the compute stream, so the copy back is
  ordered after it) and back to the GPU before the step, which runs there. Written, not run here (no
  GPU was lent to this task).

The bytes come back as they went, so the step and the weights are bit-identical to a run without
offload (tests/unit/test_optim_offload.py). So the peak of a step becomes max(forward + backward
without the state, the step with it). `state_dict()` and `load_state_dict()` (checkpoints) see the
real tensors: a state-dict pre-hook brings them back, the post-hooks send them out again, and each
parameter's state is a fresh dict every time, so a state dict already handed out keeps its tensors.
Small tensors (Adam's step counters: under 64 KiB) stay where they are.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Optional

import torch

from ecotrain.base.errors import ConfigError
from ecotrain.core.offload import MIN_BYTES, FileStore


class _Out:
    """What a parameter's state holds for an offloaded tensor: where its bytes are."""

    __slots__ = ("where", "shape", "dtype", "device")

    def __init__(self, where, t: torch.Tensor):
        self.where, self.shape, self.dtype, self.device = where, t.shape, t.dtype, t.device


class OptimizerOffload:
    """Attach to `optimizer`: its state is out of the training memory except during its step and
    its state_dict/load_state_dict calls."""

    def __init__(self, optimizer: torch.optim.Optimizer, folder: Optional[Path], device: torch.device):
        self.opt, self.cuda = optimizer, device.type == "cuda"
        self.file = None if self.cuda else FileStore(Path(folder) if folder else Path(tempfile.gettempdir()))
        self.pinned: dict[tuple, torch.Tensor] = {}  # CUDA: one page-locked buffer per state tensor, reused
        self.out = False
        self.handles = [optimizer.register_step_pre_hook(lambda *_: self.bring_back()),
                        optimizer.register_step_post_hook(lambda *_: self.send_out()),
                        optimizer.register_state_dict_pre_hook(lambda *_: self.bring_back()),
                        optimizer.register_state_dict_post_hook(lambda _o, sd: self.send_out()),
                        optimizer.register_load_state_dict_pre_hook(lambda *_: self.bring_back()),
                        optimizer.register_load_state_dict_post_hook(lambda *_: self.send_out())]
        self.send_out()

    def send_out(self) -> None:
        if self.out:
            return
        if self.file is not None:
            self.file.end = 0  # the same layout every time: each tensor is rewritten in place
        for i, (p, st) in enumerate(list(self.opt.state.items())):
            new = {}
            for k, v in st.items():
                big = isinstance(v, torch.Tensor) and v.numel() * v.element_size() >= MIN_BYTES
                if big and type(v) is not torch.Tensor:
                    raise ConfigError("memory.optimizer_offload=on: the optimizer state is sharded (FSDP's "
                                      "DTensors); use distributed.fsdp.cpu_offload=true there")
                new[k] = self._put((i, k), v) if big else v
            self.opt.state[p] = new  # a fresh dict: a state dict handed out keeps the real tensors
        self.out = True

    def bring_back(self) -> None:
        if not self.out:
            return
        for p, st in list(self.opt.state.items()):
            self.opt.state[p] = {k: self._get(v) if isinstance(v, _Out) else v for k, v in st.items()}
        self.out = False

    def _put(self, key: tuple, t: torch.Tensor) -> _Out:
        if self.cuda:
            buf = self.pinned.get(key)
            if buf is None:
                buf = self.pinned[key] = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            buf.copy_(t, non_blocking=True)  # the GPU block is reused only by work queued after this copy
            return _Out(key, t)
        return _Out(self.file.put(t.detach().contiguous()), t)

    def _get(self, o: _Out) -> torch.Tensor:
        if self.cuda:
            return self.pinned[o.where].to(o.device, non_blocking=True)
        raw = self.file.get(o.where, o.shape.numel() * torch.empty((), dtype=o.dtype).element_size())
        return raw.view(o.dtype).view(o.shape)

    def detach(self) -> None:
        """Bring the state back and remove the hooks."""
        self.bring_back()
        for h in self.handles:
            h.remove()


def offload_optimizer_state(optimizer, folder: Optional[Path], device: torch.device, strategy: str = "none"):
    """`memory.optimizer_offload: on`; one line where it cannot apply."""
    if strategy in ("fsdp", "zero2"):
        raise ConfigError(f"memory.optimizer_offload=on with distributed.strategy={strategy}: the state is sharded "
                          "DTensors; use distributed.fsdp.cpu_offload=true (FSDP's own CPU offload) instead")
    return OptimizerOffload(optimizer, folder, device)
