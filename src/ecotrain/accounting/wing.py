"""The accounting wing's callbacks: the contention watch, the ledger and carbon-aware timing."""

from __future__ import annotations

from ecotrain.accounting import threadpick
from ecotrain.accounting.contention import ContentionWatch
from ecotrain.accounting.ledger import Ledger
from ecotrain.accounting.timing import CarbonTiming
from ecotrain.callbacks.base import Callback
from ecotrain.callbacks.wing import WingContext


def run_callbacks(ctx: WingContext) -> list[Callback]:
    cfg = ctx.config
    watch = ContentionWatch()  # a busy machine: one warning, and the ledger's `contention`
    out: list[Callback] = [watch]
    ledger = None
    if cfg.ledger.enabled:
        ledger = Ledger(cfg.ledger, cfg.budget, ctx.eval_samples, watch, write_to=ctx.run_dir if ctx.is_main else None,
                        tokens_per_sample=ctx.tokens_per_sample)
        device = getattr(ctx.state, "device", None)
        if device is not None:  # CodeCarbon's start-up overlaps the rest of the set-up (energy.py)
            ledger.prepare_meter(device)
        ctx.state.cost_listeners.append(ledger)  # methods' notices: the step's work changed, one-off FLOPs
        out.append(ledger)
    most = threadpick.wanted(cfg, getattr(ctx.state, "device", None))
    if most is not None:  # threads: auto, chosen for what is paid by a probe (threadpick.py)
        out.append(threadpick.ThreadPick(cfg, most, ledger))
    if cfg.carbon.forecast:
        out.append(CarbonTiming(cfg.carbon, ctx.checkpointer, ctx.preemption, ledger))
    return out
