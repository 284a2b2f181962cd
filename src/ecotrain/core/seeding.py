"""Seeding, and torch's deterministic-algorithm flags for the length of a run.

`seed_everything(seed)` seeds Python's `random`, NumPy's global generator and torch (CPU and every
CUDA device). It sets process-global generator states and does not restore them: that is what
seeding is for.

`deterministic_algorithms(enabled)` is a context manager. With `enabled=True`, on entry it sets

- `torch.use_deterministic_algorithms(True, warn_only=True)`: deterministic kernels where torch
  has them, a warning (not an error) for an op that has none;
- `torch.backends.cudnn.benchmark = False`: no autotuning that picks kernels by timing;
- `torch.utils.deterministic.fill_uninitialized_memory = False`: torch's deterministic mode would
  otherwise fill every new tensor's memory with NaN before an op writes it, which guards only against
  an op that reads memory it never wrote. On a small CPU model that fill costs a few % of every
  step (bench/overhead.py, same harness: ratio_same_kernel 0.904 with the fill, 0.943 without);
  every op ecotrain and torch run writes its outputs, and the resume tests compare runs bit for
  bit with it off;
- `CUBLAS_WORKSPACE_CONFIG=":4096:8"` in `os.environ`, unless already set (deterministic cuBLAS
  needs it; torch reads it when cuBLAS is first used, so set it yourself before any CUDA work when it
  matters: CUDA already in use with the variable unset is warned about);

and on exit, normal or by an exception, it restores every one of them to what it was on entry:
the two deterministic flags, the fill flag, `cudnn.benchmark`, and the environment variable (removed again if it
was not set before). With `enabled=False` it changes nothing. `fit()` runs inside it, so a Python
API user's process-global flags are the same after `fit()` as before.

torch's own `use_deterministic_algorithms` also sets `torch._inductor.config.deterministic`, and
importing that module imports `torch._dynamo` and `torch._inductor` (about 2 s on a small CPU).
Here the flag goes to torch's C++ core directly, and the inductor flag is set (and restored) only
when `torch._inductor.config` is already imported: it only affects `torch.compile`, and
`torch.compile` imports that module when it is called, so a model compiled before `fit()` gets it.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
from typing import Iterator

import numpy as np
import torch

from ecotrain.base.log import log

CUBLAS_WORKSPACE = ":4096:8"  # what deterministic cuBLAS needs (or ":16:8")


def seed_everything(seed: int) -> None:
    """Seed `random`, NumPy's global generator and torch (all devices) with `seed`."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _get_flags() -> tuple[bool, bool]:
    return torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()


def _get_fill() -> bool | None:
    getter = getattr(torch._C, "_get_deterministic_fill_uninitialized_memory", None)
    return getter() if getter else None


def _set_fill(fill: bool | None) -> None:
    setter = getattr(torch._C, "_set_deterministic_fill_uninitialized_memory", None)
    if setter and fill is not None:
        setter(fill)


def _set_flags(mode: bool, warn_only: bool) -> None:
    """`torch.use_deterministic_algorithms` without its import of torch._inductor (see the module doc)."""
    setter = getattr(torch._C, "_set_deterministic_algorithms", None)
    if setter is None:  # a torch without the private setter: the public call (slower to import)
        torch.use_deterministic_algorithms(mode, warn_only=warn_only)
        return
    setter(mode, warn_only=warn_only)


@contextlib.contextmanager
def deterministic_algorithms(enabled: bool) -> Iterator[None]:
    """Deterministic torch inside the block when `enabled`; every flag restored on exit (module doc)."""
    if not enabled:
        yield
        return
    flags, fill, benchmark = _get_flags(), _get_fill(), torch.backends.cudnn.benchmark
    cublas = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    inductor = sys.modules.get("torch._inductor.config")
    inductor_prev = getattr(inductor, "deterministic", None) if inductor is not None else None
    if cublas is None and torch.cuda.is_initialized():  # torch reads the variable once, at its first cuBLAS handle
        log.warning("deterministic: CUDA was in use before this run and CUBLAS_WORKSPACE_CONFIG was not set, so "
                    "cuBLAS may already have its default workspace; set CUBLAS_WORKSPACE_CONFIG=:4096:8 before "
                    "any CUDA work (e.g. in the shell) for a run that resumes bit for bit")
    try:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
        # an op with no deterministic kernel fails at the first step (nondeterministic_error says which
        # and what to do) instead of warning while the resume promises exactness
        _set_flags(True, warn_only=False)
        _set_fill(False)  # the NaN fill of every new tensor costs a few % per step (module doc)
        if inductor is not None:
            inductor.deterministic = True
        torch.backends.cudnn.benchmark = False
        yield
    finally:
        _set_flags(*flags)
        _set_fill(fill)
        if inductor is not None:
            inductor.deterministic = inductor_prev
        torch.backends.cudnn.benchmark = benchmark
        if cublas is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        else:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = cublas


NO_DETERMINISTIC_KERNEL = " does not have a deterministic implementation"


def nondeterministic_error(exc: BaseException):
    """torch's error for an op without a deterministic kernel under `deterministic: true`, as one line
    (a ConfigError naming the op and the two ways on), or None for any other error."""
    from ecotrain.base.errors import ConfigError

    text = str(exc)
    if not isinstance(exc, RuntimeError) or NO_DETERMINISTIC_KERNEL not in text:
        return None
    head = text.split(NO_DETERMINISTIC_KERNEL)[0].split()
    op = head[-1] if head else "an op"
    return ConfigError(f"deterministic: true, but {op} has no deterministic kernel on this device, so the run "
                       "(and its resume) could not be exact; set deterministic: false (runs and resumes then "
                       "differ in the last bits), or use another op or device")
