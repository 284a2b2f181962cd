"""Start-up: seconds from launching `ecotrain fit` to its first optimizer step, against `import torch`.

The job is the default one, as a user types it:

    ecotrain fit recipes/mnist1d_cnn.yaml loop.max_steps=1 --quiet --run-dir <tmp>

with the ledger on and its default energy meter (`ledger.energy=codecarbon`), plus one callback,
loaded by import path the way a recipe names one, that writes `time.time()` to a file at the end of
the first step (after the optimizer step) and nothing else. The start-up is that time minus the
moment just before the process was launched. The baseline is the whole of `python -c "import
torch"` (launch to exit). `ecotrain --help` is timed launch to exit.

The dataset cache is warm: a first, untimed run fills it (in a temporary `ECOTRAIN_CACHE`, so the
user's cache is not touched; `--user-cache` uses the user's), and with it the energy meter's hardware
plan (accounting/meter_plan.py: CodeCarbon probes once per machine), as on a user's second run. Then the three commands alternate for
`--rounds` rounds; the figures are medians, and the ratio is median start-up / median `import torch`.
It also times the same first step written by hand in plain PyTorch (launch to the end of its first
step): `startup_over_hand` is the median start-up over that median.

    python bench/startup.py [--rounds 5] [--user-cache]

`--quick` (a check that the bench runs, not a figure): one round.
Each round also times the same fit with `ledger.energy=off`: `startup_over_hand_energy_off` is the
start-up without CodeCarbon (its import, with pandas and py-cpuinfo, shares the interpreter with
torch's), the meter's share read against the hand-written step.
Ends with `RESULT startup_ratio=<f> help_seconds=<f> startup_over_hand=<f> startup_over_hand_energy_off=<f>`. Goals: startup_ratio <= 1.5,
help_seconds < 0.3 (issue 9); startup_over_hand <= 1.1 (issue 53). On a shared machine the figures move
with the load (the hand-written script runs torch's default thread count; ecotrain picks its count from
the load, threads.py): compare figures taken in the same run only.
"""

from __future__ import annotations

import argparse
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
PROBE = "_ecotrain_first_step"
PROBE_SOURCE = '''"""bench/startup.py's probe: the wall-clock time at the end of the first step, then nothing."""
import time

from ecotrain.callbacks import Callback


class FirstStep(Callback):
    def __init__(self, file):
        self.file = file
        self.done = False

    def on_step_end(self, state):
        if not self.done:
            self.done = True
            with open(self.file, "w") as f:
                f.write(repr(time.time()))
'''


# The same first step written by hand, the floor any torch program pays (startup_over_hand). With torch >= 2.x, building a torch.optim optimizer imports torch._dynamo (its
# methods are wrapped in torch._disable_dynamo), so this floor is above `import torch` alone.
HANDWRITTEN = """
import sys, time
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Conv1d(1, 25, 5, 2, 1), nn.ReLU(), nn.Conv1d(25, 25, 3, 2, 1), nn.ReLU(),
                      nn.Conv1d(25, 25, 3, 2, 1), nn.ReLU(), nn.Flatten(), nn.LazyLinear(10))
x, y = torch.randn(100, 1, 40), torch.randint(0, 10, (100,))
model(x)
opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.05)
nn.functional.cross_entropy(model(x), y).backward()
opt.step()
open(sys.argv[1], "w").write(repr(time.time()))
"""


def ecotrain_cmd() -> list[str]:
    """The installed console script next to this Python if there is one, else `python -m ecotrain`."""
    script = Path(sys.executable).with_name("ecotrain")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "ecotrain"]


def run_checked(cmd: list[str], env: dict, what: str) -> None:
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{what} failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")


def time_whole(cmd: list[str], env: dict, what: str) -> float:
    t0 = time.perf_counter()
    run_checked(cmd, env, what)
    return time.perf_counter() - t0


def time_first_step(work: Path, env: dict, i, energy: str = "codecarbon") -> float:
    stamp = work / f"first-step-{i}.txt"
    spec = f'[{{path: "{PROBE}:FirstStep", kwargs: {{file: "{stamp}"}}}}]'
    cmd = [*ecotrain_cmd(), "fit", str(RECIPE), "loop.max_steps=1", f"ledger.energy={energy}",
           f"callbacks={spec}", "--quiet", "--run-dir", str(work / f"run-{i}")]
    t0 = time.time()
    run_checked(cmd, env, "ecotrain fit")
    if not stamp.is_file():
        sys.exit(f"ecotrain fit ran but the probe wrote no {stamp}: no step was taken?")
    return float(stamp.read_text()) - t0


def time_handwritten(work: Path, env: dict) -> float:
    stamp = work / "handwritten.txt"
    t0 = time.time()
    run_checked([sys.executable, "-c", HANDWRITTEN, str(stamp)], env, "hand-written step")
    return float(stamp.read_text()) - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--user-cache", action="store_true", help="use the user's dataset cache, not a temporary one")
    ap.add_argument("--quick", action="store_true", help="one round: checks the bench runs")
    args = ap.parse_args()
    if args.quick:
        args.rounds = 1

    work = Path(tempfile.mkdtemp(prefix="ecotrain-startup-"))
    try:
        (work / f"{PROBE}.py").write_text(PROBE_SOURCE)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(work), os.environ.get("PYTHONPATH")]))}
        if not args.user_cache:
            env["ECOTRAIN_CACHE"] = str(work / "cache")
        print(f"ecotrain: {' '.join(ecotrain_cmd())}; python: {sys.executable}; cpus: {os.cpu_count()}")

        t0 = time.perf_counter()  # untimed: fills the dataset cache, compiles .pyc files
        time_first_step(work, env, 0)
        print(f"warm-up run (dataset cache filled): {time.perf_counter() - t0:.2f} s")

        torch_s, fit_s, help_s, hand_s, off_s = [], [], [], [], []
        for r in range(1, args.rounds + 1):
            torch_s.append(time_whole([sys.executable, "-c", "import torch"], env, "import torch"))
            fit_s.append(time_first_step(work, env, r))
            help_s.append(time_whole([*ecotrain_cmd(), "--help"], env, "ecotrain --help"))
            hand_s.append(time_handwritten(work, env))
            off_s.append(time_first_step(work, env, f"{r}-off", "off"))
            print(f"round {r}: import torch {torch_s[-1]:.3f} s, fit to first step {fit_s[-1]:.3f} s "
                  f"(x{fit_s[-1] / torch_s[-1]:.2f}), --help {help_s[-1]:.3f} s, "
                  f"hand-written first step {hand_s[-1]:.3f} s, fit with ledger.energy=off {off_s[-1]:.3f} s")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    t, f, h = statistics.median(torch_s), statistics.median(fit_s), statistics.median(help_s)
    w, off = statistics.median(hand_s), statistics.median(off_s)
    print(f"median: import torch {t:.3f} s, ecotrain fit to first optimizer step {f:.3f} s, --help {h:.3f} s")
    print(f"a hand-written first AdamW step {w:.3f} s (x{w / t:.2f} import torch); "
          f"startup_over_hand = {f:.3f} / {w:.3f} = {f / w:.3f} (goal <= 1.1)")
    print(f"startup_ratio = {f:.3f} / {t:.3f} = {f / t:.3f} (goal <= 1.5); help_seconds {h:.3f} (goal < 0.3)")
    print(f"without the energy meter (ledger.energy=off): {off:.3f} s, startup_over_hand_energy_off = "
          f"{off / w:.3f}: the meter's share of the start-up is {(f - off) / w:.3f} of the hand-written step")
    print(f"RESULT startup_ratio={f / t:.4f} help_seconds={h:.4f} startup_over_hand={f / w:.4f} "
          f"startup_over_hand_energy_off={off / w:.4f}")


if __name__ == "__main__":
    main()
