"""Numeric precision: autocast for the forward pass and dynamic loss scaling for fp16.

Master weights stay fp32; bf16 needs no scaler. Skipped (inf/NaN) fp16 steps are counted.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Optional

import torch

from ecotrain.base.errors import ConfigError


def _check_supported(mode: str, dtype: torch.dtype, device: torch.device) -> None:
    """One clear error up front instead of torch silently disabling autocast (with a warning)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ok = torch.amp.is_autocast_available(device.type)
        if ok:
            with torch.autocast(device.type, dtype=dtype):
                ok = torch.is_autocast_enabled(device.type)
    if ok and device.type == "cuda" and dtype == torch.bfloat16:
        ok = torch.cuda.is_bf16_supported()
    if not ok:
        other = "bf16-mixed" if mode == "fp16-mixed" else "fp32"
        raise ConfigError(f"precision: {mode} is not supported on {device.type} by torch {torch.__version__}; "
                          f"use precision={other}")


class Precision:
    def __init__(self, mode: str, device: torch.device):
        self.mode = mode
        self.device = device
        self.dtype = {"fp32": None, "bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}[mode]
        if self.dtype is not None:
            _check_supported(mode, self.dtype, device)
        self.scaler = torch.amp.GradScaler(device.type) if mode == "fp16-mixed" else None
        self._skipped: int | torch.Tensor = 0  # a device tensor once counting: read only when asked
        self._null = contextlib.nullcontext()  # reusable: fp32 pays no context creation per step

    def autocast(self):
        if self.dtype is None:
            return self._null
        return torch.autocast(self.device.type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def unscale(self, opt: torch.optim.Optimizer) -> None:
        """Before clipping: the norm must be measured on true gradients."""
        if self.scaler:
            self.scaler.unscale_(opt)

    def step(self, opt: torch.optim.Optimizer) -> None:
        """Step the optimizer; with fp16, the scaler skips steps with inf/NaN gradients (counted)."""
        if not self.scaler:
            opt.step()
            return
        # get_scale() is a .item(): two host syncs per step. The scale tensor itself (private, pinned by
        # tests/unit/test_precision.py) is compared on the device; update() changes it in place.
        before = self.scaler._get_scale_async().clone()
        self.scaler.step(opt)
        self.scaler.update()
        self._skipped = self._skipped + (self.scaler._get_scale_async() < before).int()  # it only drops on a skip

    @property
    def skipped_steps(self) -> int:
        """Steps the fp16 grad scaler skipped (inf/NaN gradients); a host sync, so read it rarely."""
        return int(self._skipped)

    @skipped_steps.setter
    def skipped_steps(self, n: int) -> None:
        self._skipped = n

    def state_dict(self) -> dict:
        return {"scaler": self.scaler.state_dict() if self.scaler else None, "skipped_steps": self.skipped_steps}

    def load_state_dict(self, sd: dict) -> None:
        if self.scaler and sd.get("scaler"):
            self.scaler.load_state_dict(sd["scaler"])
        self.skipped_steps = sd.get("skipped_steps", 0)


def use_tf32(setting: str, device_type: str, capability: Optional[tuple], precision: str) -> bool:
    """Whether fp32 matmuls and convolutions may use TF32 (config `tf32`): `on`/`off` as said; `auto`:
    on for fp32 training on a CUDA GPU of compute capability 8.0 or more (Ampere and newer), the only
    ones with TF32 units; off on CPU, older GPUs, and under bf16/fp16 autocast (already reduced)."""
    if setting in ("on", "off"):
        return setting == "on" and device_type == "cuda"
    return device_type == "cuda" and precision == "fp32" and capability is not None and tuple(capability) >= (8, 0)


@contextlib.contextmanager
def tf32(setting: str, device, precision: str):
    """torch's TF32 flags for one fit() call (`use_tf32`), restored after."""
    if getattr(device, "type", None) != "cuda":
        yield False
        return
    cap = torch.cuda.get_device_capability(device) if torch.cuda.is_available() else None
    on = use_tf32(setting, "cuda", cap, precision)
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = on
    try:
        yield on
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
