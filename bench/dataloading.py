"""Data loading at scale: loader workers and streamed Parquet shards, measured side by side.

- ratio_workers: ecotrain with data.workers=2 against a hand-written loop over
  `DataLoader(num_workers=2)` fed the same sampler order, on a map-style dataset whose items cost
  about 1 ms of CPU each (decode-like work) and a small MLP. Goal >= 0.95.
- speedup_workers: ecotrain with data.workers=2 against data.workers=0 (what the cores give).
- stream_ratio: the same in-memory data against Parquet shards on disk (`parquet:FOLDER`), both
  with data.workers=0 (streaming's own cost, nothing hidden behind workers), a 4-layer MLP.
  Goal >= 0.8.

Throughput is training steps per second of the loop (summary.json's train_seconds on ecotrain's
side, worker start-up included on both sides). No run reaches an epoch end, so no evaluation is
timed. Rounds alternate the contenders; each figure is the median of per-round ratios.

    python bench/dataloading.py [--rounds 3] [--steps 120] [--quick]
`--quick` (a check that the bench runs, not a figure): 10 steps, one round, 20 streamed steps.
Ends with `RESULT ratio_workers=<f> speedup_workers=<f> stream_ratio=<f>`.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ecotrain import Config, fit
from ecotrain.data.sampler import EpochSampler

WIDTH, BATCH, SEED = 64, 32, 0


class Decode(torch.utils.data.Dataset):
    """Items that cost about 1 ms of CPU each: `work` rounds of a small FFT, like decoding a clip."""

    def __init__(self, n: int, work: int):
        g = torch.Generator().manual_seed(1)
        self.x, self.y, self.work = torch.randn(n, WIDTH, generator=g), torch.randint(0, 10, (n,), generator=g), work
        self.buf = np.random.default_rng(0).normal(size=256)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        acc = 0.0
        for _ in range(self.work):
            acc += float(np.abs(np.fft.rfft(self.buf)).sum())
        return self.x[i] + (acc * 0.0), self.y[i]


def calibrate(target_s: float = 1e-3) -> int:
    ds = Decode(1, 20)
    t = time.perf_counter()
    for _ in range(20):
        ds[0]
    per = (time.perf_counter() - t) / 20
    return max(1, round(20 * target_s / per))


def small_mlp(depth: int = 1, hidden: int = 128) -> nn.Module:
    torch.manual_seed(SEED)
    layers, d = [], WIDTH
    for _ in range(depth):
        layers += [nn.Linear(d, hidden), nn.ReLU()]
        d = hidden
    return nn.Sequential(*layers, nn.Linear(d, 10))


def _cfg(steps: int, workers: int, **data) -> Config:
    return Config.model_validate({
        "seed": SEED, "data": {"batch_size": BATCH, "workers": workers, **data},
        "optim": {"name": "adamw", "lr": 1e-3, "implementation": "foreach"},
        "loop": {"max_steps": steps, "max_epochs": None, "log_every": 50},
        "logging": {"progress": "off"}, "ledger": {"enabled": False}})


def ecotrain_rate(cfg: Config, model: nn.Module, data=None) -> float:
    with tempfile.TemporaryDirectory() as d:
        r = fit(cfg, model=model, data=data, run_dir=d, quiet=True)
    return r.summary["steps"] / r.summary["train_seconds"]


def hand_rate(ds, steps: int, workers: int) -> float:
    """The loop users write with workers: DataLoader over the same batches ecotrain's sampler makes."""
    model = small_mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    batches = [b.tolist() for b in EpochSampler(len(ds), BATCH, SEED).batches(0)][:steps]
    t0 = time.perf_counter()
    loader = torch.utils.data.DataLoader(ds, batch_sampler=batches, num_workers=workers, prefetch_factor=2)
    for xb, yb in loader:
        F.cross_entropy(model(xb), yb).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return len(batches) / (time.perf_counter() - t0)


def write_shards(folder: Path, x: torch.Tensor, y: torch.Tensor, shards: int = 8) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    for s, (xs, ys) in enumerate(zip(x.chunk(shards), y.chunk(shards))):
        col = pa.FixedSizeListArray.from_arrays(pa.array(xs.numpy().reshape(-1)), WIDTH)
        pq.write_table(pa.table({"x": col, "label": ys.numpy()}), folder / f"part-{s:03d}.parquet",
                       row_group_size=1024)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--quick", action="store_true", help="10 steps, one round: checks the bench runs")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.steps = 1, 10
    stream_steps = 20 if args.quick else 200
    torch.set_num_threads(1)
    work = calibrate()
    n = BATCH * args.steps + 64
    ds, val = Decode(n, work), (torch.randn(64, WIDTH), torch.randint(0, 10, (64,)))
    ratios, speedups = [], []
    for r in range(args.rounds):
        w2 = ecotrain_rate(_cfg(args.steps, 2), small_mlp(), {"train": ds, "val": val})
        hand = hand_rate(ds, args.steps, 2)
        w0 = ecotrain_rate(_cfg(args.steps, 0), small_mlp(), {"train": ds, "val": val})
        ratios.append(w2 / hand)
        speedups.append(w2 / w0)
        print(f"round {r}: workers=2 {w2:.1f} steps/s, DataLoader(num_workers=2) {hand:.1f}, workers=0 {w0:.1f}")

    # streaming: 20,000 rows x 64 floats, in memory vs 8 Parquet shards; 200 steps of 64, within one epoch
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(20000, WIDTH, generator=g), torch.randint(0, 10, (20000,), generator=g)
    stream = []
    with tempfile.TemporaryDirectory() as d:
        write_shards(Path(d), x, y)
        split = {"val_split": 0.1, "test_split": 0.2, "batch_size": 64}
        for r in range(args.rounds):
            mem = ecotrain_rate(_cfg(stream_steps, 0, **split), small_mlp(4, 256),
                                {"train": (x[:14400], y[:14400]), "val": (x[14400:16000], y[14400:16000])})
            shard = ecotrain_rate(_cfg(stream_steps, 0, name=f"parquet:{d}", **split), small_mlp(4, 256))
            stream.append(shard / mem)
            print(f"round {r}: in memory {mem:.1f} steps/s, parquet shards {shard:.1f}")
    print(f"item cost {work} FFT rounds (~1 ms); medians over {args.rounds} rounds")
    print(f"RESULT ratio_workers={statistics.median(ratios):.3f} speedup_workers={statistics.median(speedups):.3f} "
          f"stream_ratio={statistics.median(stream):.3f}")


if __name__ == "__main__":
    main()
