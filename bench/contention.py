"""The demo CNN on a busy machine: ecotrain's thread choice against torch's default, side by side.

    python bench/contention.py [--steps 600] [--rounds 3] [--hand-seconds 45] [--quick]

`--quick` (a check that the bench runs, not a figure): 20 steps, one round, no busy process, the
cgroup quota only.

The demo recipe (`make demo`: recipes/mnist1d_cnn.yaml, the MNIST-1D ConvBase CNN, batch 100,
AdamW), `--steps` steps, in rounds; each round runs every configuration once, in a rotated order,
so a swing in the machine's speed falls on all of them:

- `ecotrain, loaded`: `ecotrain fit` (the real CLI, threads: auto, OMP_NUM_THREADS unset) while the
  bench keeps 2 other CPU-bound processes (`while True: pass`) running;
- `torch default, loaded`: a hand-written loop on the same model, batch shape and optimizer, with
  torch's default thread count, under the same 2 processes (random inputs of the demo's shape: the
  CNN's work does not depend on the values). At most `--hand-seconds` of it are timed: at torch's
  default threads on a loaded 2-core machine 600 steps can take minutes;
- `ecotrain, quiet`: `ecotrain fit` with the bench's processes stopped.

steps/s is the steps over the loop's own wall time (ecotrain: summary.json `train_seconds`; the
hand-written loop: from its first step, after 5 warm-up steps), so start-up is in neither.

- `ratio_vs_torch_default`: median over rounds of ecotrain loaded / torch default loaded (goal >= 5);
- `ratio_vs_quiet`: median of ecotrain loaded / ecotrain quiet (goal >= 0.4; with 3 busy processes
  on 2 cores a fair share is 0.67);
- `quota_threads_ok`: under a simulated one-CPU quota (ECOTRAIN_CGROUP_ROOT naming a folder whose
  cpu.max is "100000 100000") and under `taskset -c 0`, the thread count ecotrain recorded in
  environment.json equals the one core it may use (true/false).

Ends with `RESULT ratio_vs_torch_default=... ratio_vs_quiet=... quota_threads_ok=true|false`.
The machine's other load (other users' jobs) is not controlled: medians over rounds, side by side.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "mnist1d_cnn.yaml"
BUSY = "while True: pass"
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}  # torch's and ecotrain's own choice
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


@contextlib.contextmanager
def load(n: int):
    """`n` CPU-bound processes for the block (started and stopped by this bench only)."""
    procs = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(n)]
    try:
        time.sleep(1.0)  # let them reach the run queue
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def ecotrain_fit(run: Path, steps: int, prefix: tuple = (), **env) -> dict:
    """One `ecotrain fit` of the demo recipe; (steps/s, the threads it chose)."""
    cmd = [*prefix, sys.executable, "-m", "ecotrain", "fit", str(RECIPE), f"loop.max_steps={steps}",
           "--run-dir", str(run), "--overwrite", "--quiet"]
    r = subprocess.run(cmd, cwd=ROOT, env=clean_env(**env), capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise SystemExit(f"ecotrain fit failed:\n{r.stderr[-2000:]}")
    summary = json.loads((run / "summary.json").read_text())
    threads = json.loads((run / "environment.json").read_text())["hardware"]["threads"]
    return {"rate": summary["steps"] / summary["train_seconds"], "threads": threads}


def hand_loop(steps: int, seconds: float) -> None:
    """The loop a user writes: torch's default threads, the demo's model, batch and optimizer."""
    import torch
    import torch.nn.functional as F

    from ecotrain.models import ConvBase

    torch.manual_seed(0)
    model = ConvBase(40, 10)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.05)
    x, y = torch.randn(4000, 40), torch.randint(0, 10, (4000,))

    def step(i: int) -> None:
        idx = torch.randint(0, 4000, (100,))
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()

    for i in range(5):
        step(i)
    t0, done = time.perf_counter(), 0
    while done < steps and time.perf_counter() - t0 < seconds:
        step(done)
        done += 1
    print(f"HAND {done / (time.perf_counter() - t0):.3f} {torch.get_num_threads()}")


def hand_fit(steps: int, seconds: float) -> dict:
    r = subprocess.run([sys.executable, __file__, "--hand-loop", "--steps", str(steps), "--hand-seconds",
                        str(seconds)], cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=900)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("HAND ")), None)
    if line is None:
        raise SystemExit(f"the hand-written loop failed:\n{r.stderr[-2000:]}")
    _, rate, threads = line.split()
    return {"rate": float(rate), "threads": int(threads)}


def quota_check(tmp: Path, steps: int = 50, taskset: bool = True) -> bool:
    """The threads ecotrain picks under a simulated one-CPU quota and under `taskset -c 0`: one."""
    cg = tmp / "cgroup"
    cg.mkdir(exist_ok=True)
    (cg / "cpu.max").write_text("100000 100000\n")
    ok = True
    for label, prefix, env in [("cgroup quota 1 CPU", (), {"ECOTRAIN_CGROUP_ROOT": str(cg)}),
                               ("taskset -c 0", ("taskset", "-c", "0") if shutil.which("taskset") else None, {})][:1 + taskset]:
        if prefix is None:
            print(f"quota: {label}: taskset not installed, skipped")
            continue
        t = ecotrain_fit(tmp / f"quota-{len(prefix)}", steps, prefix, **env)["threads"]
        good = t["threads"] == t["cores"] == 1
        ok &= good
        print(f"quota: {label}: threads {t['threads']}, usable cores {t['cores']} ({t['why']}): "
              f"{'ok' if good else 'WRONG'}")
    return ok


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--hand-seconds", type=float, default=45.0)
    p.add_argument("--busy", type=int, default=2, help="CPU-bound processes in the loaded configurations")
    p.add_argument("--hand-loop", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--quick", action="store_true", help="20 steps, one round, no load: checks the bench runs")
    args = p.parse_args()
    if args.quick:
        args.steps, args.rounds, args.hand_seconds, args.busy = 20, 1, 1.0, 0
    if args.hand_loop:
        return hand_loop(args.steps, args.hand_seconds)

    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the start")
    with tempfile.TemporaryDirectory(prefix="ecotrain-contention-") as tmp:
        tmp = Path(tmp)
        configs = {
            "ecotrain_loaded": lambda r: _loaded(args.busy, lambda: ecotrain_fit(tmp / f"loaded-{r}", args.steps)),
            "torch_default_loaded": lambda r: _loaded(args.busy, lambda: hand_fit(args.steps, args.hand_seconds)),
            "ecotrain_quiet": lambda r: ecotrain_fit(tmp / f"quiet-{r}", args.steps),
        }
        names = list(configs)
        rates: dict = {k: [] for k in names}
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                out = configs[name](r)
                rates[name].append(out["rate"])
                t = out["threads"]
                how = f"{t['threads']} threads ({t['source']}: {t['why']})" if isinstance(t, dict) else f"{t} threads"
                print(f"round {r}: {name:22s} {out['rate']:7.1f} steps/s  {how}", flush=True)
        vs_torch = statistics.median(a / b for a, b in zip(rates["ecotrain_loaded"], rates["torch_default_loaded"]))
        vs_quiet = statistics.median(a / b for a, b in zip(rates["ecotrain_loaded"], rates["ecotrain_quiet"]))
        for name in names:
            print(f"median {name:22s} {statistics.median(rates[name]):7.1f} steps/s")
        ok = quota_check(tmp, min(50, args.steps), taskset=not args.quick)
    print(f"RESULT ratio_vs_torch_default={vs_torch:.2f} ratio_vs_quiet={vs_quiet:.2f} "
          f"quota_threads_ok={'true' if ok else 'false'}")


def _loaded(busy: int, fn):
    with load(busy):
        return fn()


if __name__ == "__main__":
    main()
