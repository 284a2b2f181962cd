"""The wings that add callbacks to every run: the one place they are registered.

`fit()` asks each of these for its callbacks after the core has built its own (assemble.py); a
program on top of ecotrain adds its own with `register`. A wing is a function
`callbacks.wing.WingContext -> list[Callback]` that returns nothing when its config section is off.
"""

from __future__ import annotations

from ecotrain.accounting import read_ledger  # noqa: F401 - a wing's reader the methods are handed (assemble: distill's teacher cost)
from ecotrain.accounting.wing import run_callbacks as accounting
from ecotrain.callbacks.wing import Wing
from ecotrain.tracking import run_callbacks as tracking

WINGS: list[Wing] = [accounting, tracking]


def register(wing: Wing) -> Wing:
    """Add a wing to every later run of this process (once; usable as a decorator)."""
    if wing not in WINGS:
        WINGS.append(wing)
    return wing
