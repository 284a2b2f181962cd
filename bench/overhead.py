"""Per-step overhead of ecotrain against a hand-written PyTorch loop, measured side by side.

The same tiny MLP (40 -> 64 -> 10), batch 32, AdamW, random data, the same validation pass at
each epoch end. ecotrain runs with its default callbacks on: progress bar (rendered to a null
terminal), metrics.jsonl logging, early-stopping bookkeeping, the divergence guard.
Rounds alternate (ecotrain, hand-written, ...); the ratio is the median of per-round ratios.

    python bench/overhead.py [--steps 3000] [--rounds 5]
`ratio_same_kernel` is the loop's own cost: both sides on PyTorch's default AdamW kernel and
ecotrain with the cost ledger off; `ledger_cost` is what the ledger takes from the same run (its
one-time first-step FLOP count and CodeCarbon's start, amortised over --steps). Also against the
loop most users write (`DataLoader(shuffle=True)`, default AdamW), and with the EMA method on.
Ends with `RESULT ratio=... ratio_same_kernel=... ratio_dataloader=... ema_on_over_off=... ledger_cost=...`.
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
from ecotrain.callbacks import ProgressBar


def make_data(n: int = 3200, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 40, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    return (x[: n * 9 // 10], y[: n * 9 // 10]), (x[n * 9 // 10 :], y[n * 9 // 10 :])


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(40, 64), nn.ReLU(), nn.Linear(64, 10))


def hand_loop(model, opt, epoch_batches, val, steps: int) -> float:
    """The hand-written loop both baselines share; `epoch_batches(epoch)` yields one epoch's (x, y)."""
    xv, yv = val
    step, epoch = 0, 0
    t0 = time.perf_counter()
    while step < steps:
        model.train()
        for xb, yb in epoch_batches(epoch):
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if step >= steps:
                break
        epoch += 1
        model.eval()
        with torch.inference_mode():  # the same validation pass as ecotrain's: loss and accuracy
            loss_sum = acc_sum = 0
            for i in range(0, len(yv), 128):
                out = model(xv[i : i + 128])
                loss_sum += F.cross_entropy(out, yv[i : i + 128], reduction="sum")
                acc_sum += (out.argmax(-1) == yv[i : i + 128]).sum()
            float(loss_sum), float(acc_sum)
    return steps / (time.perf_counter() - t0)


def handwritten(steps: int, seed: int, **opt_kw) -> float:
    """Tensors indexed by a seeded permutation, AdamW (PyTorch's default kernel unless `opt_kw`)."""
    (x, y), val = make_data()
    model = make_model(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0, **opt_kw)
    g = torch.Generator().manual_seed(seed)

    def epoch_batches(epoch):
        perm = torch.randperm(len(y), generator=g)
        return ((x[idx], y[idx]) for idx in perm.split(32))
    return hand_loop(model, opt, epoch_batches, val, steps)


def dataloader_loop(steps: int, seed: int) -> float:
    """The loop most users write: DataLoader(shuffle=True) over a TensorDataset, default AdamW."""
    (x, y), val = make_data()
    model = make_model(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32, shuffle=True,
                                         generator=torch.Generator().manual_seed(seed))
    return hand_loop(model, opt, lambda epoch: loader, val, steps)


def with_ecotrain(steps: int, seed: int, implementation: str = "auto", methods=(), ledger: bool = True) -> float:
    train, val = make_data()
    cfg = Config.model_validate({
        "seed": seed, "data": {"batch_size": 32}, "methods": list(methods), "ledger": {"enabled": ledger},
        "optim": {"name": "adamw", "lr": 1e-3, "implementation": implementation},
        "loop": {"max_steps": steps, "max_epochs": None, "log_every": 50},
        "early_stopping": {"enabled": True, "patience": 1000},
        "logging": {"progress": "off"},  # the bar is added below, drawn to a null terminal
    })
    console = Console(file=open(os.devnull, "w"), force_terminal=True, width=120)
    with tempfile.TemporaryDirectory() as d:
        r = fit(cfg, model=make_model(seed), data={"train": train, "val": val},
                callbacks=[ProgressBar(console=console)], run_dir=d)
    return r.summary["steps"] / r.summary["train_seconds"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)  # a tiny model: threads add noise, not speed
    with_ecotrain(200, 0), handwritten(200, 0)  # warm-up
    ratios, same, loader, ema, ledger_cost = [], [], [], [], []
    for r in range(args.rounds):
        e, h = with_ecotrain(args.steps, r), handwritten(args.steps, r)
        # the pure loop overhead: both sides on PyTorch's default (for-loop) AdamW kernel
        # the loop's own cost: both sides on PyTorch's default (for-loop) AdamW kernel, ecotrain's loop and
        # callbacks with the cost ledger off; the ledger's cost is measured on its own (ledger_cost)
        e2, h2 = with_ecotrain(args.steps, r, "for-loop", ledger=False), handwritten(args.steps, r, foreach=False)
        e3 = with_ecotrain(args.steps, r, "for-loop")  # the same, ledger on
        d = dataloader_loop(args.steps, r)  # the loop most users write, against ecotrain's defaults
        m = with_ecotrain(args.steps, r, methods=[{"name": "ema"}])  # EMA on: its cost, against e
        ratios.append(e / h), same.append(e2 / h2), loader.append(e / d), ema.append(m / e)
        ledger_cost.append(1 - e3 / e2)
        print(f"round {r}: ecotrain {e:6.0f} vs handwritten {h:6.0f} steps/s (ratio {e / h:.3f}); "
              f"same optimizer kernel: {e2:6.0f} vs {h2:6.0f} (ratio {e2 / h2:.3f}); DataLoader loop {d:6.0f} "
              f"(ratio {e / d:.3f}); with EMA {m:6.0f} ({m / e:.3f} of without)", file=sys.stderr)
    ratio, ratio_same = statistics.median(ratios), statistics.median(same)
    ratio_loader, ratio_ema = statistics.median(loader), statistics.median(ema)
    cost = statistics.median(ledger_cost)
    print(f"ecotrain/handwritten steps/s ratio: {ratio:.3f} with ecotrain's defaults (fused AdamW); "
          f"{ratio_same:.3f} with the same optimizer kernel on both sides; {ratio_loader:.3f} against a "
          f"DataLoader(shuffle=True) loop with default AdamW; EMA on runs at {ratio_ema:.3f} of EMA off "
          f"(median of {args.rounds})")
    print(f"the cost ledger (first-step FLOP count, CodeCarbon's start and sampling threads) costs {cost:.1%} of "
          f"the steps/s of a {args.steps}-step run; one-time costs, so less in longer runs")
    print(f"RESULT ratio={ratio:.3f} ratio_same_kernel={ratio_same:.3f} ratio_dataloader={ratio_loader:.3f} "
          f"ema_on_over_off={ratio_ema:.3f} ledger_cost={cost:.3f}")


if __name__ == "__main__":
    main()
