"""The same work (mnist1d CNN, global batch 128, 600 steps) on 1 process and on 2 ranks under
torchrun (DDP and FSDP), side by side. On a 2-core CPU machine 2 ranks cannot be faster: each rank
gets one core and pays gloo all-reduces; the figures say what the distributed path costs here.

    python bench/distributed.py [--steps 600]
Ends with `RESULT loop_ratio_ddp=<2-rank/1-process loop time> loop_ratio_fsdp=<...> wall_1=<s> wall_ddp=<s> wall_fsdp=<s>`.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(nproc: int, strategy: str, steps: int, run_dir: Path) -> tuple[float, float]:
    args = ["-m", "ecotrain", "fit", "recipes/mnist1d_cnn.yaml", f"loop.max_steps={steps}", "data.batch_size=128",
            "loop.eval_every=200", f"distributed.strategy={strategy}", "--run-dir", str(run_dir), "--quiet"]
    launcher = [sys.executable] if nproc == 1 else [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                                                   str(nproc), "--master-addr", "127.0.0.1", "--master-port", str(port())]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # one thread per process: 2 threads on a loaded 2-core box thrash
    t0 = time.perf_counter()
    r = subprocess.run([*launcher, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    if r.returncode:
        sys.exit(f"{strategy} x{nproc} failed:\n{r.stderr[-2000:]}")
    return wall, json.loads((run_dir / "summary.json").read_text())["train_seconds"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=600)
    steps = ap.parse_args().steps
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        w1, l1 = run(1, "none", steps, d / "one")
        wd, ld = run(2, "ddp", steps, d / "ddp")
        wf, lf = run(2, "fsdp", steps, d / "fsdp")
    print(f"1 process: wall {w1:.1f}s (loop {l1:.1f}s); DDP x2: wall {wd:.1f}s (loop {ld:.1f}s, {ld / l1:.2f}x); "
          f"FSDP x2: wall {wf:.1f}s (loop {lf:.1f}s, {lf / l1:.2f}x)")
    print(f"RESULT loop_ratio_ddp={ld / l1:.2f} loop_ratio_fsdp={lf / l1:.2f} wall_1={w1:.1f} wall_ddp={wd:.1f} wall_fsdp={wf:.1f}")


if __name__ == "__main__":
    main()
