"""The FLOP counter, re-exported: it lives in the core (ecotrain/core/flops.py, torch only), since the
methods count their one-off work with it and the methods' floor is below the accounting wing."""

from ecotrain.core.flops import StepFlopCounter, StepFlops, attention_flops, count_flops, warm_up

__all__ = ["StepFlopCounter", "StepFlops", "attention_flops", "count_flops", "warm_up"]
