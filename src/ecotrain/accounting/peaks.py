"""Model FLOPs utilisation (MFU): the FLOPs a run counted per second, over the device's dense peak.

The peaks are NVIDIA's datasheet figures without sparsity, by the precision the matmuls ran in
(bf16/fp16 tensor cores for the mixed precisions; TF32 for fp32 where TF32 was on; plain fp32
otherwise). A device whose name matches no row has no MFU, said so, rather than a guessed one; a
CPU has none (its peak depends on the cores, their vector units and clock) unless `ledger.peak_flops`
gives one (a measured matmul peak, say).
"""

from __future__ import annotations

import re
from typing import Optional

TERA = 1e12
# (pattern on torch.cuda.get_device_name, dense peak TFLOP/s by precision); the first match wins
PEAKS: list[tuple[str, Optional[dict[str, float]]]] = [
    (r"\bH100\b.*\bNVL\b", None),  # a lower-clocked variant: not in the table rather than the SXM's figure
    (r"\bH100\b.*\bPCIe\b", {"bf16": 756.5, "tf32": 378.0, "fp32": 51.2}),
    (r"\bH100\b", {"bf16": 989.4, "tf32": 494.7, "fp32": 66.9}),  # SXM ("H100 80GB HBM3")
    (r"\bH200\b", {"bf16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    (r"\bA100\b", {"bf16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    (r"\bL40S\b", {"bf16": 362.0, "tf32": 183.0, "fp32": 91.6}),
    (r"\bL4\b", {"bf16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    (r"\bA10\b", {"bf16": 125.0, "tf32": 62.5, "fp32": 31.2}),  # not the A10G, which has its own clocks
]
SOURCE = "NVIDIA datasheet, dense (no sparsity)"


def matmul_precision(precision: str, tf32: bool) -> str:
    """The peak that applies: `bf16` (bf16/fp16 mixed precision), `tf32` (fp32 with TF32 on), `fp32`."""
    return "bf16" if "16" in precision else "tf32" if tf32 else "fp32"


def peak_flops(device_name: str, precision: str) -> tuple[Optional[float], str]:
    """(dense peak FLOP/s of one device at `precision`, where it comes from or why there is none)."""
    if device_name == "cpu":
        return None, "unknown: no dense peak is known for a CPU; set ledger.peak_flops to a measured one"
    for pattern, peaks in PEAKS:
        if re.search(pattern, device_name, re.IGNORECASE):
            if peaks is None:
                break
            return peaks[precision] * TERA, f"{SOURCE}, {precision}"
    return None, f"unknown: no peak in the table for '{device_name}'; set ledger.peak_flops"


def mfu(flops: Optional[float], seconds: float, devices: int, device_name: str, precision: str,
        given_peak: Optional[float] = None) -> dict:
    """ledger.json `mfu`: counted FLOPs (training and evaluation) per second of the run's wall time,
    over `devices` x the peak (`given_peak`: ledger.peak_flops, per device)."""
    peak, source = (given_peak, "ledger.peak_flops") if given_peak else peak_flops(device_name, precision)
    achieved = flops / seconds if flops is not None and seconds > 0 else None
    value = achieved / (peak * devices) if achieved is not None and peak else None
    return {"value": value, "achieved_flops_per_second": achieved, "peak_flops_per_second": peak,
            "devices": devices, "precision": precision, "source": source if peak else None,
            "missing_reason": None if value is not None else (source if not peak else "no FLOPs were counted"),
            "method": "counted FLOPs (flops.total) / wall seconds / (devices x dense peak)"}
