"""Per-step overhead of ecotrain against a hand-written PyTorch loop, measured side by side.

The same tiny MLP (40 -> 64 -> 10), batch 32, AdamW, random data, the same validation pass at
each epoch end. ecotrain runs with its default callbacks on: progress bar (rendered to a null
terminal), metrics.jsonl logging, early-stopping bookkeeping, the divergence guard, deterministic
algorithms (its default: exact resume needs them).

Interleaved, step by step: this shared VM's speed swings by up to 2x within a minute, so two
loops timed one after the other compare two machines. Here the hand-written loop runs inside the
same process as a callback, one of its steps after each of ecotrain's, each loop on its own model,
optimizer and data; each is timed from the end of the other's step to the end of its own (the
hand-written one with torch's deterministic flags as they were before `fit`, as in a user's
script; switching them is timed for neither). Both run with automatic garbage collection off, as
ecotrain's loop does (the hand-written loop's collections would be triggered by ecotrain's
allocations too: leaving them off favours the hand-written loop). Both loops then see the
same machine, and the ratio of their step times is steady to ~1% between rounds. The ratio per
round is (hand-written seconds) / (ecotrain seconds) for the same number of steps; the RESULT
figures are medians over rounds.

    python bench/overhead.py [--steps 3000] [--rounds 5]

- `ratio`: ecotrain's defaults (fused AdamW, cost ledger on) against PyTorch's default AdamW.
- `ratio_same_kernel`: the loop's own cost: both on PyTorch's for-loop AdamW kernel, the ledger off.
- `ratio_dataloader`: ecotrain's defaults against the loop most users write
  (`DataLoader(shuffle=True)` over a TensorDataset, default AdamW).
- `ema_on_over_off`: ecotrain with the EMA method over without it (each against its yardstick).
- `ledger_cost`: the share of steps/s the cost ledger takes per step (its first-step FLOP count
  included; CodeCarbon's start is start-up, measured by bench/startup.py).
Ends with `RESULT ratio=... ratio_same_kernel=... ratio_dataloader=... ema_on_over_off=... ledger_cost=...`.
`--quick` (a check that the bench runs, not a figure): 20 steps, one round, no warm-up.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
from rich.console import Console
from torch import nn

from ecotrain import Config, fit
from ecotrain.callbacks import Callback, ProgressBar


def make_data(n: int = 3200, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 40, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    return (x[: n * 9 // 10], y[: n * 9 // 10]), (x[n * 9 // 10 :], y[n * 9 // 10 :])


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(40, 64), nn.ReLU(), nn.Linear(64, 10))


class HandWritten:
    """A hand-written training loop, driven one step at a time; `loader` False: tensors indexed by
    a seeded permutation; True: `DataLoader(shuffle=True)` over a TensorDataset."""

    def __init__(self, seed: int, loader: bool = False, **opt_kw):
        (x, y), (self.xv, self.yv) = make_data()
        self.model = make_model(seed)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3, weight_decay=0.0, **opt_kw)
        g = torch.Generator().manual_seed(seed)
        if loader:
            dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32, shuffle=True,
                                             generator=g)
            self.epoch_batches = lambda: iter(dl)
        else:
            self.epoch_batches = lambda: ((x[idx], y[idx]) for idx in torch.randperm(len(y), generator=g).split(32))
        self.batches = self.epoch_batches()

    def step(self) -> None:
        batch = next(self.batches, None)
        if batch is None:  # the epoch's end: the same validation pass as ecotrain's (loss and accuracy)
            self.validate()
            self.batches = self.epoch_batches()
            batch = next(self.batches)
        xb, yb = batch
        loss = F.cross_entropy(self.model(xb), yb)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def validate(self) -> None:
        model, xv, yv = self.model, self.xv, self.yv
        model.eval()
        with torch.inference_mode():
            loss_sum = acc_sum = 0
            for i in range(0, len(yv), 128):
                out = model(xv[i : i + 128])
                loss_sum += F.cross_entropy(out, yv[i : i + 128], reduction="sum")
                acc_sum += (out.argmax(-1) == yv[i : i + 128]).sum()
            float(loss_sum), float(acc_sum)
        model.train()


class Interleave(Callback):
    """After each ecotrain step, one hand-written step; each loop's time is summed on its own."""

    def __init__(self, hand: HandWritten, user_flags: tuple):
        self.hand, self.user_flags = hand, user_flags
        self.hand_seconds = self.eco_seconds = 0.0
        self.last = None

    def on_step_end(self, state):
        t = time.perf_counter()
        if self.last is not None:  # the first step holds one-time work of both: not compared
            self.eco_seconds += t - self.last
        eco_flags = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
        fill = torch.utils.deterministic.fill_uninitialized_memory
        torch.use_deterministic_algorithms(self.user_flags[0], warn_only=self.user_flags[1])
        torch.utils.deterministic.fill_uninitialized_memory = self.user_flags[2]
        t0 = time.perf_counter()
        self.hand.step()
        t1 = time.perf_counter()
        torch.use_deterministic_algorithms(eco_flags[0], warn_only=eco_flags[1])
        torch.utils.deterministic.fill_uninitialized_memory = fill
        if self.last is not None:
            self.hand_seconds += t1 - t0
        self.last = time.perf_counter()


def side_by_side(steps: int, seed: int, hand: HandWritten, implementation: str = "auto", methods=(),
                 ledger: bool = True) -> float:
    """(hand-written seconds) / (ecotrain seconds) over the same steps, interleaved."""
    train, val = make_data()
    cfg = Config.model_validate({
        "seed": seed, "data": {"batch_size": 32}, "methods": list(methods), "ledger": {"enabled": ledger},
        "optim": {"name": "adamw", "lr": 1e-3, "implementation": implementation},
        "loop": {"max_steps": steps, "max_epochs": None, "log_every": 50},
        "early_stopping": {"enabled": True, "patience": 1000},
        "logging": {"progress": "off"},  # the bar is added below, drawn to a null terminal
    })
    console = Console(file=open(os.devnull, "w"), force_terminal=True, width=120)
    user_flags = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
                  torch.utils.deterministic.fill_uninitialized_memory)
    pair = Interleave(hand, user_flags)
    with tempfile.TemporaryDirectory() as d:
        fit(cfg, model=make_model(seed), data={"train": train, "val": val},
            callbacks=[ProgressBar(console=console), pair], run_dir=d)
    return pair.hand_seconds / pair.eco_seconds


def same_kernel_ratio(steps: int = 3000, rounds: int = 3) -> float:
    """`ratio_same_kernel` alone: the median over `rounds` of the loop's own cost (after a warm-up)."""
    torch.set_num_threads(1)
    side_by_side(200, 0, HandWritten(0))
    return statistics.median(side_by_side(steps, r, HandWritten(r, foreach=False), "for-loop", ledger=False)
                             for r in range(rounds))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="20 steps, one round: checks the bench runs")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.rounds = 20, 1
    torch.set_num_threads(1)  # a tiny model: threads add noise, not speed
    if not args.quick:
        side_by_side(200, 0, HandWritten(0))  # warm-up
    ratios, same, loader, ema, ledger_cost = [], [], [], [], []
    for r in range(args.rounds):
        e = side_by_side(args.steps, r, HandWritten(r))  # defaults (fused AdamW) vs default AdamW
        # the loop's own cost: both sides on PyTorch's for-loop AdamW kernel, the ledger off
        s = side_by_side(args.steps, r, HandWritten(r, foreach=False), "for-loop", ledger=False)
        s_ledger = side_by_side(args.steps, r, HandWritten(r, foreach=False), "for-loop")  # the same, ledger on
        d = side_by_side(args.steps, r, HandWritten(r, loader=True))  # the loop most users write
        m = side_by_side(args.steps, r, HandWritten(r), methods=[{"name": "ema"}])  # EMA on, against e
        ratios.append(e), same.append(s), loader.append(d), ema.append(m / e), ledger_cost.append(1 - s_ledger / s)
        print(f"round {r}: ecotrain/hand-written steps/s {e:.3f}; same optimizer kernel {s:.3f} (ledger on "
              f"{s_ledger:.3f}); against a DataLoader loop {d:.3f}; with EMA {m:.3f} ({m / e:.3f} of without)",
              file=sys.stderr)
    ratio, ratio_same = statistics.median(ratios), statistics.median(same)
    ratio_loader, ratio_ema = statistics.median(loader), statistics.median(ema)
    cost = statistics.median(ledger_cost)
    print(f"ecotrain/hand-written steps/s ratio, interleaved step by step: {ratio:.3f} with ecotrain's defaults "
          f"(fused AdamW); {ratio_same:.3f} with the same optimizer kernel on both sides; {ratio_loader:.3f} against "
          f"a DataLoader(shuffle=True) loop with default AdamW; EMA on runs at {ratio_ema:.3f} of EMA off "
          f"(median of {args.rounds})")
    print(f"the cost ledger takes {cost:.1%} of the steps/s per step (its first-step FLOP count included)")
    print(f"RESULT ratio={ratio:.3f} ratio_same_kernel={ratio_same:.3f} ratio_dataloader={ratio_loader:.3f} "
          f"ema_on_over_off={ratio_ema:.3f} ledger_cost={cost:.3f}")


if __name__ == "__main__":
    main()
