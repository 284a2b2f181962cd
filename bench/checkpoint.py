"""What checkpointing costs the training loop, and how big a checkpoint is.

The same run (an MLP of ~1.1M parameters, AdamW, batch 64, random data) three ways, rounds
alternating: no periodic checkpoints, a synchronous save every N steps, a background save every
N steps. Cost = extra wall time of the training loop as a fraction of the no-save run (median
over rounds). Size = bytes on disk of one checkpoint / raw bytes of the tensors it holds.

    python bench/checkpoint.py [--steps 400] [--every 50] [--rounds 3] [--quick]
`--quick` (a check that the bench runs, not a figure): 20 steps, a save every 10, one round.
Ends with `RESULT size_ratio=<f> sync_cost=<f> background_cost=<f>`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn

from ecotrain import Config, fit
from ecotrain.checkpoint import list_checkpoints, read_checkpoint


def make_data(n=4096):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 256, generator=g), torch.randint(0, 10, (n,), generator=g)


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 768), nn.ReLU(), nn.Linear(768, 768), nn.ReLU(), nn.Linear(768, 10))


def run(steps: int, every: int | None, background: bool, run_dir: Path) -> float:
    x, y = make_data()
    cfg = Config.model_validate({
        "data": {"batch_size": 64}, "optim": {"lr": 1e-3},
        "loop": {"max_steps": steps, "max_epochs": None, "log_every": 50, "eval_every": 10_000},
        "checkpoint": {"every_n_steps": every, "background": background, "at_end": False, "keep_last": 2},
        "logging": {"progress": "off"},
    })
    r = fit(cfg, model=make_model(), data={"train": (x[:3600], y[:3600]), "val": (x[3600:], y[3600:])}, run_dir=run_dir)
    return r.summary["train_seconds"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="20 steps, one round: checks the bench runs")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.every, args.rounds = 20, 10, 1
    torch.set_num_threads(1)
    sync_costs, bg_costs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if not args.quick:
            run(50, None, False, tmp / "warm")
        for r in range(args.rounds):
            base = run(args.steps, None, False, tmp / f"base{r}")
            sync = run(args.steps, args.every, False, tmp / f"sync{r}")
            bg = run(args.steps, args.every, True, tmp / f"bg{r}")
            sync_costs.append(sync / base - 1), bg_costs.append(bg / base - 1)
            print(f"round {r}: loop seconds none {base:.2f}  sync {sync:.2f}  background {bg:.2f}", file=sys.stderr)
        ckpt = list_checkpoints(tmp / "sync0")[0]
        on_disk = sum(p.stat().st_size for p in ckpt.iterdir())
        tensors, _ = read_checkpoint(ckpt)
        raw = sum(t.numel() * t.element_size() for t in tensors.values())
    size_ratio = on_disk / raw
    sync_cost, bg_cost = statistics.median(sync_costs), statistics.median(bg_costs)
    saves = args.steps // args.every
    print(f"checkpoint {on_disk / 1e6:.2f} MB on disk for {raw / 1e6:.2f} MB of tensors (ratio {size_ratio:.4f})")
    print(f"saving every {args.every} steps ({saves} saves in {args.steps} steps): "
          f"sync costs {sync_cost:+.1%} of loop time, background {bg_cost:+.1%} (median of {args.rounds})")
    print(f"RESULT size_ratio={size_ratio:.4f} sync_cost={sync_cost:.4f} background_cost={bg_cost:.4f}")


if __name__ == "__main__":
    main()
