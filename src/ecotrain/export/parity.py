"""The parity check every export passes before its file is kept: the exported program (read back from
its bytes, as a user would load it; and onnxruntime for ONNX) runs the run's own test split beside the
eager model. Recorded: the largest absolute difference of any output, the same relative to the eager
outputs' size, and the test metrics of each (`loop.evaluate`, the one evaluation ecotrain has).

Tolerance: the largest difference divided by the largest eager output magnitude (at least 1, so
outputs near zero are held to an absolute 1e-4); above it, the export is refused.

NaN and Inf: an output the exported program makes non-finite where the eager model's is finite (or
finite where eager's is not, or another NaN/Inf than eager's) is counted (`nonfinite`) and refuses the
export whatever the tolerance; a Python `max()` meeting a NaN would keep the old value and pass it.

A fresh process (`fresh_process`): a .pt2 is proven by reading it back where nothing of the training
is loaded: a new `python` (sys.executable) that imports torch and ecotrain's safe reader, with
`transformers` made unimportable, loads the file's bytes and runs the example inputs; its outputs are
held to the same tolerance. A program that needs the model's library (an output class it returns)
fails there, not on the user's machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from ecotrain.core import loop
from ecotrain.core.batch import leaves
from ecotrain.base.errors import EcotrainError
from ecotrain.base.safeload import torch_load

DEFAULT_TOLERANCE = 1e-4
FRESH_TIMEOUT = 600  # seconds for the fresh process to import torch, load the program and run one batch
BLOCKED = ("transformers",)  # libraries a model may be built with, which the exported program must not need

# the fresh process: argv = program.pt2 inputs.pt outputs.pt; its last stderr line is the reason it failed
FRESH_CODE = """
import sys
for name in sys.argv[4].split(","):
    sys.modules[name] = None  # importing it fails: the program must run without it
import torch
from torch.utils._pytree import tree_leaves
from ecotrain.base.safeload import load_pt2, torch_load
with open(sys.argv[1], "rb") as f:
    program, _ = load_pt2(f.read(), sys.argv[1])
args, kwargs = torch_load(sys.argv[2], sys.argv[2])  # the one safe reader, here too
with torch.no_grad():
    out = program.module()(*args, **kwargs)
torch.save([t for t in tree_leaves(out) if isinstance(t, torch.Tensor)], sys.argv[3])
"""


class Compared(nn.Module):
    """Runs the eager model and another runner on each batch, keeps the largest difference, and returns
    the runner's outputs (so `loop.evaluate` measures the runner). The runner sits in a tuple, not as a
    submodule: an exported program's module refuses `.eval()`, and it was traced in eval mode anyway."""

    def __init__(self, eager: nn.Module, other: Callable):
        super().__init__()
        self.eager, self._other = eager, (other,)
        self.max_abs_diff, self.max_abs_eager, self.nonfinite = 0.0, 0.0, 0

    def forward(self, *args, **kwargs):
        ref, got = self.eager(*args, **kwargs), self._other[0](*args, **kwargs)
        a, b = leaves(ref), leaves(got)
        if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
            raise EcotrainError(f"export: parity check failed: the exported program returns "
                                f"{[tuple(y.shape) for y in b]}, the eager model {[tuple(x.shape) for x in a]}")
        for x, y in zip(a, b):
            if x.numel():
                diff, eager, nonfinite = compare_outputs(x, y)
                self.max_abs_diff, self.max_abs_eager = max(self.max_abs_diff, diff), max(self.max_abs_eager, eager)
                self.nonfinite += nonfinite
        return got


def compare_outputs(x: torch.Tensor, y: torch.Tensor) -> tuple[float, float, int]:
    """(largest |x - y| where both are finite, largest finite |x|, how many elements differ in being
    NaN/Inf): every figure finite, so the running maxima never meet a NaN."""
    x, y = x.detach().double().cpu(), y.detach().double().cpu()
    fx, fy = torch.isfinite(x), torch.isfinite(y)
    same = (x == y) | (torch.isnan(x) & torch.isnan(y))  # eager's own NaN/Inf, reproduced, is parity
    both = fx & fy
    diff = float((x[both] - y[both]).abs().max()) if bool(both.any()) else 0.0
    eager = float(x[fx].abs().max()) if bool(fx.any()) else 0.0
    return diff, eager, int((~both & ~same).sum())


def check(model: nn.Module, runners: dict[str, Callable], task, source, batch_size: int) -> dict:
    """{eager: metrics, <runner>: {max_abs_diff, relative_diff, metrics}, max_abs_diff, relative_diff}."""
    cpu = torch.device("cpu")
    record: dict = {"eager": loop.evaluate(model, source, task, batch_size, cpu, prefix="test")}
    for name, fn in runners.items():
        both = Compared(model, fn)
        got = loop.evaluate(both, source, task, batch_size, cpu, prefix="test")
        record[name] = {"max_abs_diff": both.max_abs_diff,
                        "relative_diff": both.max_abs_diff / max(1.0, both.max_abs_eager),
                        "nonfinite": both.nonfinite, **got}
    record["max_abs_diff"] = max(record[n]["max_abs_diff"] for n in runners)
    record["relative_diff"] = max(record[n]["relative_diff"] for n in runners)
    record["nonfinite"] = sum(record[n]["nonfinite"] for n in runners)
    return record


def enforce(record: dict, tolerance: float, what: str) -> None:
    """Exit 1 with one line when the export differs from eager by more than the tolerance, or makes
    any output NaN/Inf that eager does not."""
    bad = [n for n in record if isinstance(record[n], dict) and record[n].get("nonfinite")]
    if bad:
        n = record[bad[0]]["nonfinite"]
        raise EcotrainError(f"export: parity check failed: {what} ({bad[0]}) returns NaN/Inf for {n} output "
                            f"value{'s' if n != 1 else ''} of the test split where the eager model's are finite (or "
                            "the other way round); nothing was written (whatever --tolerance: a NaN is no small "
                            "difference; torch.export.draft_export(model, args) shows how the program was traced)")
    if not record["relative_diff"] <= tolerance:  # NaN fails too
        worst = max((n for n in record if isinstance(record[n], dict) and "relative_diff" in record[n]),
                    key=lambda n: record[n]["relative_diff"])
        raise EcotrainError(f"export: parity check failed: {what} ({worst}) differs from the eager model on the "
                            f"test split by {record['max_abs_diff']:.3g} at most ({record['relative_diff']:.3g} "
                            f"relative), above the tolerance {tolerance:g}; nothing was written (a model that is "
                            "random or stateful at inference cannot be exported as it is; --tolerance to accept it)")


def fold(record: dict, more: dict, length: int) -> dict:
    """`record` (the test split's check) with `more` (the same runners at another sequence length) folded
    in: each runner's largest difference and NaN count over both, and `lengths`: {length: largest diff}."""
    runners = [n for n in more if isinstance(more[n], dict) and "max_abs_diff" in more[n]]
    for n in runners:
        mine, theirs = record[n], more[n]
        mine["max_abs_diff"] = max(mine["max_abs_diff"], theirs["max_abs_diff"])
        mine["relative_diff"] = max(mine["relative_diff"], theirs["relative_diff"])
        mine["nonfinite"] += theirs["nonfinite"]
    record.setdefault("lengths", {})[str(length)] = more["max_abs_diff"]
    record["max_abs_diff"] = max(record[n]["max_abs_diff"] for n in runners)
    record["relative_diff"] = max(record[n]["relative_diff"] for n in runners)
    record["nonfinite"] = sum(record[n]["nonfinite"] for n in runners)
    return record


def fresh_process(model: Callable, data: bytes, args: tuple, kwargs: dict, what: str) -> dict:
    """{max_abs_diff, relative_diff, nonfinite} of the .pt2 `data` loaded and run on (`args`, `kwargs`) in a
    fresh Python process that cannot import `transformers` (FRESH_CODE), against `model` here; one line
    (EcotrainError) when that process cannot load or run it."""
    if isinstance(model, nn.Module):
        model.eval()
    with torch.no_grad():
        ref = leaves(model(*args, **kwargs))
    src = str(Path(__file__).resolve().parents[2])  # the folder holding the ecotrain package
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)}
    with tempfile.TemporaryDirectory(prefix="ecotrain-export-") as tmp:
        program, inputs, outputs = (os.path.join(tmp, n) for n in ("program.pt2", "inputs.pt", "outputs.pt"))
        with open(program, "wb") as f:
            f.write(data)
        torch.save((tuple(a.detach().cpu() for a in args), {k: v.detach().cpu() for k, v in kwargs.items()}), inputs)
        try:
            r = subprocess.run([sys.executable, "-c", FRESH_CODE, program, inputs, outputs, ",".join(BLOCKED)],
                               capture_output=True, text=True, timeout=FRESH_TIMEOUT, cwd=tmp, env=env)
        except subprocess.TimeoutExpired:
            raise EcotrainError(f"export: parity check failed: {what} did not load and run in a fresh Python "
                                f"process within {FRESH_TIMEOUT} s; nothing was written") from None
        if r.returncode != 0 or not os.path.exists(outputs):
            last = next((ln.strip() for ln in reversed(r.stderr.splitlines()) if ln.strip()), f"exit {r.returncode}")
            raise EcotrainError(f"export: parity check failed: {what} does not load and run in a fresh Python process "
                                f"without {', '.join(BLOCKED)} ({last[:240]}); nothing was written (return tensors "
                                "from forward, not a library's output object)")
        got = torch_load(outputs, "the fresh process's outputs")
    if len(got) != len(ref) or any(x.shape != y.shape for x, y in zip(ref, got)):
        raise EcotrainError(f"export: parity check failed: {what}, loaded in a fresh process, returns "
                            f"{[tuple(y.shape) for y in got]}, the eager model {[tuple(x.shape) for x in ref]}")
    diff = eager = 0.0
    nonfinite = 0
    for x, y in zip(ref, got):
        if x.numel():
            d, e, n = compare_outputs(x, y)
            diff, eager, nonfinite = max(diff, d), max(eager, e), nonfinite + n
    return {"max_abs_diff": diff, "relative_diff": diff / max(1.0, eager), "nonfinite": nonfinite,
            "blocked": list(BLOCKED)}


def with_fresh(record: dict, fresh: dict) -> dict:
    """`record` with the fresh process's figures in, as `fresh_process`, and in its maxima."""
    record["fresh_process"] = fresh
    record["max_abs_diff"] = max(record["max_abs_diff"], fresh["max_abs_diff"])
    record["relative_diff"] = max(record["relative_diff"], fresh["relative_diff"])
    record["nonfinite"] += fresh["nonfinite"]
    return record
