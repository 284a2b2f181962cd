"""The run's device: `device: auto | cpu | cuda` in the config made a torch.device. Its own module
so that trainer.py, inference.py and lrfind.py share it without importing one another."""

from __future__ import annotations

import sys
from typing import Optional

import torch

from ecotrain.base.errors import ConfigError


def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: 'cuda' asked for but no CUDA device is available; use device=auto or cpu")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def same_device(held: torch.device, wanted: torch.device, current: int = 0) -> bool:
    """Whether a tensor on `held` is already on `wanted`. A tensor's device always has an index but
    the run's is plain `cuda` (the current device, `current`): `cuda:0 != cuda` in torch, so a plain
    `!=` is always true and copies every time."""
    def index(d: torch.device) -> int:
        return d.index if d.index is not None else current

    return held.type == wanted.type and index(held) == index(wanted)


def current_index(device: torch.device) -> int:
    """The index that a plain `cuda` stands for (torch.cuda.current_device()); 0 elsewhere."""
    return torch.cuda.current_device() if device.type == "cuda" and device.index is None else 0


def memory_peaks(device: torch.device) -> dict:
    """This process's memory peaks since it started. CUDA (None elsewhere): the allocator's peak of
    tensors (`max_memory_allocated`) and of what its cache held (`max_memory_reserved`: what
    nvidia-smi shows, less the CUDA context), with the device's name and size. Host: the peak RSS."""
    out = {"host_peak_rss_bytes": host_peak_rss(), "gpu_peak_allocated_bytes": None,
           "gpu_peak_reserved_bytes": None, "gpu_total_bytes": None, "gpu_name": None}
    if device.type == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(device)
        out.update(gpu_peak_allocated_bytes=int(torch.cuda.max_memory_allocated(device)),
                   gpu_peak_reserved_bytes=int(torch.cuda.max_memory_reserved(device)),
                   gpu_total_bytes=int(props.total_memory), gpu_name=props.name)
    return out


def host_peak_rss() -> Optional[int]:
    """The process's peak resident set size in bytes (None where the platform has no getrusage)."""
    try:
        import resource  # Unix only
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # bytes on macOS, KiB on Linux


def combine_memory(ranks: list[dict]) -> dict:
    """ledger.json `memory` and summary.json's peak from every rank's `memory_peaks`: the largest
    peak of any rank (the one that must fit), and each rank's own with several."""
    def largest(key):
        values = [r[key] for r in ranks if r.get(key) is not None]
        return max(values) if values else None

    out = {**ranks[0], "gpu_peak_allocated_bytes": largest("gpu_peak_allocated_bytes"),
           "gpu_peak_reserved_bytes": largest("gpu_peak_reserved_bytes"),
           "host_peak_rss_bytes": largest("host_peak_rss_bytes"),
           "method": "this segment's process: torch.cuda.max_memory_allocated/reserved; host: getrusage ru_maxrss"}
    if len(ranks) > 1:
        out["per_rank"] = [{k: r.get(k) for k in ("gpu_peak_allocated_bytes", "gpu_peak_reserved_bytes",
                                                  "host_peak_rss_bytes")} for r in ranks]
    return out
