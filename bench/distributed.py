"""Two benchmarks of the distributed path, each under real torchrun (2 gloo ranks, one thread each).

1. The same work (mnist1d CNN, global batch 128, 600 steps) on 1 process and on 2 ranks (DDP and
   FSDP), side by side. On a 2-core CPU machine 2 ranks cannot be faster: each rank gets one core
   and pays gloo all-reduces; the figures say what the distributed path costs here.
2. `ratio_ddp_handwritten`: ecotrain's DDP (its defaults: divergence guard, preemption agreement,
   logging, ledger, final checkpoint) against the loop a user writes by hand: the model wrapped in
   `DistributedDataParallel`, Adam, each rank taking its half of a seeded global batch. An MLP
   40 -> 256 -> 256 -> 10 with global batch 100, small enough that per-step costs show. Both run
   in the same torchrun job, rounds alternating (ecotrain, hand-written, ...); steps/s is the
   training loop's (set-up excluded on both sides); the ratio is the median of per-round ratios.
   The hand-written loop uses PyTorch's default Adam (a for-loop kernel on CPU), ecotrain its
   fused one; `ratio_ddp_same_kernel` gives the hand-written loop the fused kernel too, so it
   shows the loop's own per-step cost.

    python bench/distributed.py [--steps 600] [--ddp-steps 1500] [--rounds 5] [--only-ddp-handwritten] [--quick]
Ends with `RESULT loop_ratio_ddp=<2-rank/1-process loop time> loop_ratio_fsdp=<...> wall_1=<s> wall_ddp=<s>
wall_fsdp=<s> ratio_ddp_handwritten=<ecotrain/hand-written steps/s> ratio_ddp_same_kernel=<...>`
(`--only-ddp-handwritten`: the last two keys only). `--quick` (a check that the bench runs, not a
figure): 10 steps everywhere, one round.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GLOBAL_BATCH, N_SAMPLES = 100, 10_000


def port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(nproc: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
            "--master-addr", "127.0.0.1", "--master-port", str(port())]


ENV = {**os.environ, "OMP_NUM_THREADS": "1"}  # one thread per process: 2 threads on a loaded 2-core box thrash


def run(nproc: int, strategy: str, steps: int, run_dir: Path) -> tuple[float, float]:
    args = ["-m", "ecotrain", "fit", "recipes/mnist1d_cnn.yaml", f"loop.max_steps={steps}", "data.batch_size=128",
            "loop.eval_every=200", f"distributed.strategy={strategy}", "--run-dir", str(run_dir), "--quiet"]
    launcher = [sys.executable] if nproc == 1 else torchrun(nproc)
    t0 = time.perf_counter()
    r = subprocess.run([*launcher, *args], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    if r.returncode:
        sys.exit(f"{strategy} x{nproc} failed:\n{r.stderr[-2000:]}")
    return wall, json.loads((run_dir / "summary.json").read_text())["train_seconds"]


# -- ecotrain DDP against a hand-written DDP loop (the worker side runs under torchrun) ---------
def _data():
    import torch
    g = torch.Generator().manual_seed(0)
    return torch.randn(N_SAMPLES, 40, generator=g), torch.randint(0, 10, (N_SAMPLES,), generator=g)


def _mlp(seed: int):
    import torch
    from torch import nn
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(40, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))


def _handwritten(steps: int, seed: int, fused: bool = False) -> float:
    import torch
    import torch.distributed as td
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = td.get_rank(), td.get_world_size()
    x, y = _data()
    model = DDP(_mlp(seed))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, **({"fused": True} if fused else {}))
    per_rank = GLOBAL_BATCH // world
    step, epoch = 0, 0
    td.barrier()
    t0 = time.perf_counter()
    while step < steps:
        perm = torch.randperm(N_SAMPLES, generator=torch.Generator().manual_seed(seed * 1000 + epoch))
        for b in range(N_SAMPLES // GLOBAL_BATCH):
            idx = perm[b * GLOBAL_BATCH + rank * per_rank : b * GLOBAL_BATCH + (rank + 1) * per_rank]
            loss = F.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if step >= steps:
                break
        epoch += 1
    return steps / (time.perf_counter() - t0)


def _ecotrain(steps: int, seed: int, run_dir: Path) -> float:
    from ecotrain import Config, fit
    cfg = Config.model_validate({
        "seed": seed, "data": {"batch_size": GLOBAL_BATCH}, "optim": {"name": "adam", "lr": 1e-3},
        "loop": {"max_steps": steps, "max_epochs": None}, "distributed": {"strategy": "ddp"},
        "logging": {"progress": "off"},
    })
    r = fit(cfg, model=_mlp(seed), data={"train": _data()}, run_dir=run_dir, quiet=True)
    return r.summary["steps"] / r.summary["train_seconds"]


def worker(steps: int, rounds: int, out: Path) -> None:
    import torch
    import torch.distributed as td
    torch.set_num_threads(1)
    td.init_process_group("gloo")  # ecotrain's fit() reuses this group
    with tempfile.TemporaryDirectory() as d:
        shared = Path(d) if td.get_rank() == 0 else None
        paths = [shared]
        td.broadcast_object_list(paths, src=0)  # one run folder per round, the same on every rank
        warm = min(100, steps)
        _ecotrain(warm, 0, paths[0] / "warm"), _handwritten(warm, 0)  # warm-up: imports, allocator, threads
        rows = []
        for r in range(rounds):
            e = _ecotrain(steps, r, paths[0] / f"round-{r}")
            h = _handwritten(steps, r)
            hf = _handwritten(steps, r, fused=True)
            rows.append((e, h, hf))
            if td.get_rank() == 0:
                print(f"round {r}: ecotrain DDP {e:6.1f} vs hand-written DDP {h:6.1f} steps/s (ratio {e / h:.3f}); "
                      f"with the fused Adam {hf:6.1f} (ratio {e / hf:.3f})", file=sys.stderr, flush=True)
        td.barrier()
    if td.get_rank() == 0:
        out.write_text(json.dumps(rows))
    os._exit(0)  # gloo's group teardown at interpreter exit can abort (see distributed.TorchDist.shutdown)


def ddp_handwritten(steps: int, rounds: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "rows.json"
        cmd = [*torchrun(2), str(Path(__file__).resolve()), "--worker", "--ddp-steps", str(steps),
               "--rounds", str(rounds), "--out", str(out)]
        r = subprocess.run(cmd, cwd=ROOT, env={**ENV, "PYTHONPATH": str(ROOT)}, stderr=subprocess.PIPE, text=True,
                           timeout=1800)
        sys.stderr.write("".join(line + "\n" for line in r.stderr.splitlines() if line.startswith("round ")))
        if r.returncode or not out.exists():
            sys.exit(f"ecotrain vs hand-written DDP failed:\n{r.stderr[-3000:]}")
        rows = json.loads(out.read_text())
    ratio, same = statistics.median(e / h for e, h, _ in rows), statistics.median(e / hf for e, _, hf in rows)
    print(f"DDP x2, MLP 40-256-256-10, global batch {GLOBAL_BATCH}: ecotrain {statistics.median(r[0] for r in rows):.1f} "
          f"vs hand-written {statistics.median(r[1] for r in rows):.1f} steps/s; ratio {ratio:.3f} "
          f"({same:.3f} against the hand-written loop with the fused Adam; median of {len(rows)} rounds)")
    return ratio, same


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--ddp-steps", type=int, default=1500)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only-ddp-handwritten", action="store_true")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="10 steps, one round: checks the bench runs")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.ddp_steps, args.rounds = 10, 10, 1
    if args.worker:
        return worker(args.ddp_steps, args.rounds, args.out)
    result = ""
    if not args.only_ddp_handwritten:
        steps = args.steps
        with tempfile.TemporaryDirectory() as d:
            d = Path(d)
            w1, l1 = run(1, "none", steps, d / "one")
            wd, ld = run(2, "ddp", steps, d / "ddp")
            wf, lf = run(2, "fsdp", steps, d / "fsdp")
        print(f"1 process: wall {w1:.1f}s (loop {l1:.1f}s); DDP x2: wall {wd:.1f}s (loop {ld:.1f}s, {ld / l1:.2f}x); "
              f"FSDP x2: wall {wf:.1f}s (loop {lf:.1f}s, {lf / l1:.2f}x)")
        result = (f"loop_ratio_ddp={ld / l1:.2f} loop_ratio_fsdp={lf / l1:.2f} wall_1={w1:.1f} wall_ddp={wd:.1f} "
                  f"wall_fsdp={wf:.1f} ")
    ratio, same = ddp_handwritten(args.ddp_steps, args.rounds)
    print(f"RESULT {result}ratio_ddp_handwritten={ratio:.3f} ratio_ddp_same_kernel={same:.3f}")


if __name__ == "__main__":
    main()
