"""The parity check every export passes before its file is kept: the exported program (read back from
its bytes, as a user would load it; and onnxruntime for ONNX) runs the run's own test split beside the
eager model. Recorded: the largest absolute difference of any output, the same relative to the eager
outputs' size, and the test metrics of each (`loop.evaluate`, the one evaluation ecotrain has).

Tolerance: the largest difference divided by the largest eager output magnitude (at least 1, so
outputs near zero are held to an absolute 1e-4); above it, the export is refused.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from ecotrain import loop
from ecotrain.batch import leaves
from ecotrain.errors import EcotrainError

DEFAULT_TOLERANCE = 1e-4


class Compared(nn.Module):
    """Runs the eager model and another runner on each batch, keeps the largest difference, and returns
    the runner's outputs (so `loop.evaluate` measures the runner). The runner sits in a tuple, not as a
    submodule: an exported program's module refuses `.eval()`, and it was traced in eval mode anyway."""

    def __init__(self, eager: nn.Module, other: Callable):
        super().__init__()
        self.eager, self._other = eager, (other,)
        self.max_abs_diff, self.max_abs_eager = 0.0, 0.0

    def forward(self, *args, **kwargs):
        ref, got = self.eager(*args, **kwargs), self._other[0](*args, **kwargs)
        a, b = leaves(ref), leaves(got)
        if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
            raise EcotrainError(f"export: parity check failed: the exported program returns "
                                f"{[tuple(y.shape) for y in b]}, the eager model {[tuple(x.shape) for x in a]}")
        for x, y in zip(a, b):
            if x.numel():
                self.max_abs_diff = max(self.max_abs_diff, float((x.double() - y.double()).abs().max()))
                self.max_abs_eager = max(self.max_abs_eager, float(x.double().abs().max()))
        return got


def check(model: nn.Module, runners: dict[str, Callable], task, source, batch_size: int) -> dict:
    """{eager: metrics, <runner>: {max_abs_diff, relative_diff, metrics}, max_abs_diff, relative_diff}."""
    cpu = torch.device("cpu")
    record: dict = {"eager": loop.evaluate(model, source, task, batch_size, cpu, prefix="test")}
    for name, fn in runners.items():
        both = Compared(model, fn)
        got = loop.evaluate(both, source, task, batch_size, cpu, prefix="test")
        record[name] = {"max_abs_diff": both.max_abs_diff,
                        "relative_diff": both.max_abs_diff / max(1.0, both.max_abs_eager), **got}
    record["max_abs_diff"] = max(record[n]["max_abs_diff"] for n in runners)
    record["relative_diff"] = max(record[n]["relative_diff"] for n in runners)
    return record


def enforce(record: dict, tolerance: float, what: str) -> None:
    """Exit 1 with one line when the export differs from eager by more than the tolerance."""
    if not record["relative_diff"] <= tolerance:  # NaN fails too
        worst = max((n for n in record if isinstance(record[n], dict) and "relative_diff" in record[n]),
                    key=lambda n: record[n]["relative_diff"])
        raise EcotrainError(f"export: parity check failed: {what} ({worst}) differs from the eager model on the "
                            f"test split by {record['max_abs_diff']:.3g} at most ({record['relative_diff']:.3g} "
                            f"relative), above the tolerance {tolerance:g}; nothing was written (a model that is "
                            "random or stateful at inference cannot be exported as it is; --tolerance to accept it)")
