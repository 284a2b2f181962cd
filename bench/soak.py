"""Soak: SIGKILL the real CLI again and again, resume it with `--resume auto`, and check that nothing
is lost: the final weights equal an uninterrupted run's, byte for byte, and after every kill the
newest checkpoint folder verifies (the project's own check, `verify_checkpoint`).

A run is a few thousand tiny steps (an MLP on 2000 random samples) with a checkpoint every few steps. Each cycle
starts `python -m ecotrain fit RECIPE --run-dir RUN --resume auto` and kills it one of three ways,
chosen by a seeded RNG:
  step    SIGKILL at the end of a random step (sometimes the step a save was due at);
  save    SIGKILL inside the next checkpoint write, after the tensors and meta.json are in the
          temporary folder and before the manifest and the rename (as tests/integration/
          test_resume.py's KillDuringSave); with background saves it lands in the writer thread
          while the training thread runs on;
  outside SIGKILL from this process after a random delay, wherever the child happens to be.
Runs alternate synchronous and background saves (checkpoint.background). The killer is a callback
named in the recipe that reads its orders from a file, so the recipe, and the config every resume
checks, never changes: no `--allow-config-change`. Not part of `make test`. `--minutes` bounds the
kill phase, which starts after the uninterrupted reference run; the run in hand then finishes.

`--racers 2` starts two resumers together each cycle: one works, the other must say in one line that
the folder is busy (exit 2), or find the run finished, or take the folder over once the first ended.

    python bench/soak.py [--minutes 5] [--steps 3000] [--every 5] [--seed 0] [--racers 1] [--quick]

`--quick` (a check that the bench runs, not a figure): 60 steps, a kill phase of 3 s (one kill, then the
run finishes), the work folder removed at the end.
Ends with `RESULT cycles=<n> identical=<true|false> kills_in_save=<n> invalid_latest=<n> runs=<n> stale_tmp=<n>
racers=<n> busy_refused=<n> lost=<n>` (stale_tmp: temporary folders of killed saves still in checkpoints/ at
the end of the runs; lost: racers that failed otherwise, invalid newest checkpoints and failed cycles).
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ecotrain import Callback

ROOT = Path(__file__).resolve().parents[1]


class Killer(Callback):
    """Reads `orders` (a JSON file) at the start of the fit: {"kind": "none" | "step" | "save", "step": N}."""

    def __init__(self, orders: str):
        o = json.loads(Path(orders).read_text())
        self.kind, self.step = o["kind"], o.get("step", 0)

    def on_step_end(self, state):
        if self.kind == "step" and state.step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.kind == "save" and state.step >= self.step:
            self.kind = "armed"
            from ecotrain.checkpoint import format as fmt

            def digest_then_die(path):  # the manifest's checksums come next: the save is half written
                os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(60)  # never reached

            fmt._digest = digest_then_die


def recipe(work: Path, steps: int, every: int, background: bool, orders: Path) -> Path:
    import numpy as np
    import yaml

    data = work / "data.npz"  # a linear rule on 32 random features: no sklearn import per cycle (digits' costs ~1 s)
    if not data.exists():
        g = np.random.default_rng(0)
        x = g.standard_normal((2000, 32)).astype(np.float32)
        np.savez(data, x=x, y=(x @ g.standard_normal((32, 10))).argmax(1).astype(np.int64))
    tree = {"name": "soak", "seed": 3, "device": "cpu",
            "data": {"name": "npz", "path": str(data), "batch_size": 16, "val_split": 0.1},
            "model": {"name": "mlp", "kwargs": {"hidden": [16]}},
            "optim": {"lr": 2e-3}, "schedule": {"name": "cosine", "warmup": 50},
            "loop": {"max_steps": steps, "max_epochs": None, "log_every": 25, "eval_every": 250},
            "checkpoint": {"every_n_steps": every, "keep_last": 2, "background": background},
            "logging": {"progress": "off"}, "ledger": {"enabled": False},  # CodeCarbon's start-up: not the subject
            "callbacks": [{"path": "bench.soak:Killer", "kwargs": {"orders": str(orders)}}]}
    p = work / f"recipe-{'bg' if background else 'sync'}.yaml"
    p.write_text(yaml.safe_dump(tree))
    return p


def start(recipe_path: Path, run: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "ecotrain", "fit", str(recipe_path), "--run-dir", str(run),
                             "--resume", "auto", "--quiet"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def newest_step(run: Path) -> int:
    from ecotrain.checkpoint.manager import list_checkpoints

    found = list_checkpoints(run)
    return int(found[0].name.split("-")[1]) if found else 0


def latest_is_valid(run: Path) -> bool:
    """The newest complete-looking checkpoint folder verifies (or there is none yet)."""
    from ecotrain.checkpoint.format import verify_checkpoint
    from ecotrain.checkpoint.manager import list_checkpoints
    from ecotrain.base.errors import CheckpointError

    found = list_checkpoints(run)
    if not found:
        return True
    try:
        verify_checkpoint(found[0])
        return True
    except CheckpointError as exc:
        print(f"INVALID latest: {exc}", file=sys.stderr)
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--every", type=int, default=5, help="checkpoint every N steps")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--racers", type=int, default=1, help="commands started together on the run folder each cycle")
    ap.add_argument("--quick", action="store_true", help="60 steps, one kill: checks the bench runs")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.minutes = 60, 0.05
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="ecotrain-soak-"))
    if args.quick:
        atexit.register(shutil.rmtree, work, ignore_errors=True)
    orders = work / "orders.json"
    recipes = {bg: recipe(work, args.steps, args.every, bg, orders) for bg in (False, True)}

    orders.write_text(json.dumps({"kind": "none"}))
    t0 = time.perf_counter()
    ref = work / "reference"
    p = start(recipes[False], ref)
    err = p.communicate()[1]
    if p.returncode != 0:
        sys.exit(f"the uninterrupted run failed ({p.returncode}): {err[-2000:]}")
    reference = (ref / "model.safetensors").read_bytes()
    one_run = time.perf_counter() - t0
    print(f"reference: {args.steps} steps in {one_run:.1f}s", flush=True)

    deadline = time.perf_counter() + args.minutes * 60  # the kill phase; then the run in hand is finished
    cycles = kills_in_save = invalid = runs = mismatched = failures = stale_tmp = refused = lost = 0
    kinds: dict[str, int] = {}
    while time.perf_counter() < deadline or runs == 0:
        background = runs % 2 == 1
        run = work / f"run-{runs}"
        runs += 1
        finished = False
        while not finished:
            at = newest_step(run)
            last_call = time.perf_counter() > deadline  # past the bound: let it run to the end
            kind = "none" if last_call else rng.choice(["step", "step", "save", "save", "outside"])
            step = at + rng.randint(1, max(2, args.steps // 12))
            orders.write_text(json.dumps({"kind": kind if kind != "outside" else "none", "step": step}))
            procs = [start(recipes[background], run) for _ in range(args.racers)]  # started together
            if kind == "outside":
                try:
                    procs[0].wait(timeout=rng.uniform(0.2, 0.8) * one_run)  # start-up, training or a save
                except subprocess.TimeoutExpired:
                    for q in procs:
                        q.send_signal(signal.SIGKILL)
            outcomes = [(q, q.communicate()[1]) for q in procs]
            busy = [q for q, e in outcomes if q.returncode == 2 and "is writing this run folder" in e]
            refused += len(busy)
            others = [(q, e) for q, e in outcomes if q not in busy]
            if not others:  # every racer found the folder busy: the holder had just ended; go again
                continue
            p, err = others[0]
            for q, e in others[1:]:  # a second racer that got the folder after the first ended
                if q.returncode not in (0, -signal.SIGKILL):
                    lost += 1
                    print(f"cycle {cycles}: a racer exited {q.returncode}: {e.strip().splitlines()[-1:]}",
                          file=sys.stderr)
            if p.returncode == 0:
                finished = True
                continue
            if p.returncode != -signal.SIGKILL:
                failures += 1
                print(f"cycle {cycles}: exit {p.returncode}: {err.strip().splitlines()[-1:] }", file=sys.stderr)
                if failures > 3:
                    sys.exit("stopping: the CLI keeps failing")
                continue
            cycles += 1
            kinds[kind] = kinds.get(kind, 0) + 1
            ckpts = run / "checkpoints"
            if kind == "save" and ckpts.is_dir() and any(n.name.startswith(".tmp-") for n in ckpts.iterdir()):
                kills_in_save += 1
            invalid += not latest_is_valid(run)
        same = (run / "model.safetensors").read_bytes() == reference
        mismatched += not same
        stale_tmp += sum(n.name.startswith(".tmp-") for n in (run / "checkpoints").iterdir())  # killed saves' leftovers
        print(f"run {runs} ({'background' if background else 'sync'} saves): cycles so far {cycles}, "
              f"final weights {'identical' if same else 'DIFFER'}", flush=True)
    print(f"kills by kind: {kinds}; {time.perf_counter() - t0:.0f}s; work folder {work}")
    print(f"RESULT cycles={cycles} identical={'true' if mismatched == 0 else 'false'} kills_in_save={kills_in_save} "
          f"invalid_latest={invalid} runs={runs} stale_tmp={stale_tmp} racers={args.racers} busy_refused={refused} "
          f"lost={lost + invalid + failures}")


if __name__ == "__main__":
    main()
