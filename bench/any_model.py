"""Your model, your data: the figures of the generic batch and task (docs/api.md), measured here.

    python bench/any_model.py [--rounds 3] [--steps 1500]

- `getitem_before_first_step`: `__getitem__` calls on a 20,000-item map-style Dataset before the
  first optimizer step (batch 64): the first item (the task's shape), the 16 sampled for the
  fingerprint, then the first batch.
- `hf_resume_identical`: examples/hf_text_classification.py killed with SIGKILL mid-epoch (after its
  step-20 checkpoint), then resumed with `--resume`: are the final weights bit-identical to an
  uninterrupted run's? `stream_resume_identical`: the same for examples/stream.py (an
  IterableDataset through torchdata's StatefulDataLoader).
- `regression_r2`: examples/tabular_regression.py's test R2.
- `generic_over_fast`: seconds per step of a tuple-of-tensors batch `(x, y, sample_id)` through the
  generic path (task.target=1, tree walks) over the `(x, y)` fast path, both interleaved step by step
  with the same hand-written loop (bench/overhead.py's harness), median over rounds.
Ends with `RESULT getitem_before_first_step=... hf_resume_identical=... stream_resume_identical=...
regression_r2=... generic_over_fast=...`.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from safetensors import safe_open
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import HandWritten, Interleave, make_data, make_model  # noqa: E402

from ecotrain import Callback, Config, fit  # noqa: E402
from ecotrain.callbacks import ProgressBar  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


class Counting(torch.utils.data.Dataset):
    def __init__(self, n: int):
        self.n, self.reads = n, 0
        self.labels = [i % 10 for i in range(n)]

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.reads += 1
        return torch.full((8,), float(i % 7)), self.labels[i]


class ReadsAtFirstStep(Callback):
    def __init__(self, ds):
        self.ds, self.reads = ds, None

    def on_after_backward(self, state):  # before the first optimizer step
        if self.reads is None:
            self.reads = self.ds.reads


def getitem_before_first_step(tmp: Path) -> int:
    ds = Counting(20_000)
    probe = ReadsAtFirstStep(ds)
    cfg = Config.model_validate({"data": {"batch_size": 64}, "loop": {"max_steps": 1, "max_epochs": None},
                                 "ledger": {"enabled": False}, "checkpoint": {"at_end": False}})
    fit(cfg, model=nn.Linear(8, 10), data={"train": ds}, callbacks=[probe], run_dir=tmp / "count", quiet=True)
    return probe.reads


def final_weights(run_dir: Path) -> dict:
    newest = sorted((run_dir / "checkpoints").glob("step-*"))[-1]
    with safe_open(str(newest / "tensors.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys() if k.startswith("model/")}


def kill_and_resume_identical(script: str, tmp: Path, args: list[str], kill_after: int = 20) -> bool:
    """Run `script` whole; run it again, SIGKILL it once its step-`kill_after` checkpoint exists (the run
    goes on past it: the kill lands mid-epoch, at an unknown step), resume; compare the final weights."""
    whole, killed = tmp / f"{Path(script).stem}-whole", tmp / f"{Path(script).stem}-killed"
    cmd = [PY, str(ROOT / "examples" / script), *args]
    subprocess.run([*cmd, "--run-dir", str(whole)], check=True, capture_output=True)
    proc = subprocess.Popen([*cmd, "--run-dir", str(killed)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    marker = killed / "checkpoints" / f"step-{kill_after:08d}" / "MANIFEST.json"
    while not marker.exists() and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    subprocess.run([*cmd, "--run-dir", str(killed), "--resume"], check=True, capture_output=True)
    a, b = final_weights(whole), final_weights(killed)
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def regression_r2(tmp: Path) -> float:
    out = subprocess.run([PY, str(ROOT / "examples" / "tabular_regression.py"), "--csv", str(tmp / "houses.csv"),
                          "--run-dir", str(tmp / "regression")], check=True, capture_output=True, text=True).stdout
    return float(out.split("test_r2=")[1].split()[0])


class TripleSource:
    """In-memory arrays whose batches are `(x, y, sample_id)`: the generic path (no (x, y) shortcut)."""

    def __init__(self, x, y):
        self.x, self.y, self.ids = x, y, torch.arange(len(y))

    def __len__(self):
        return len(self.y)

    def take(self, idx):
        return self.x.index_select(0, idx), self.y.index_select(0, idx), self.ids.index_select(0, idx)

    def take_range(self, start, stop):
        return self.x[start:stop], self.y[start:stop], self.ids[start:stop]

    def labels(self):
        return self.y

    def hash_into(self, h):
        h.update(self.x.numpy().tobytes())


def side_by_side(steps: int, seed: int, generic: bool) -> float:
    """(hand-written seconds) / (ecotrain seconds), interleaved (bench/overhead.py's harness)."""
    (x, y), val = make_data()
    train = TripleSource(x, y) if generic else (x, y)
    cfg = Config.model_validate({
        "seed": seed, "data": {"batch_size": 32}, "ledger": {"enabled": False},
        "task": {"name": "classification", "target": 1 if generic else None},
        "optim": {"name": "adamw", "lr": 1e-3, "implementation": "for-loop"},
        "loop": {"max_steps": steps, "max_epochs": None, "log_every": 50},
        "logging": {"progress": "off"},
    })
    console = Console(file=open(os.devnull, "w"), force_terminal=True, width=120)
    flags = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.utils.deterministic.fill_uninitialized_memory)
    pair = Interleave(HandWritten(seed, foreach=False), flags)
    with tempfile.TemporaryDirectory() as d:
        fit(cfg, model=make_model(seed), data={"train": train, "val": TripleSource(*val) if generic else val},
            callbacks=[ProgressBar(console=console), pair], run_dir=d)
    return pair.hand_seconds / pair.eco_seconds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one round: checks the bench runs (no figures)")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.steps = 1, 20
    torch.set_num_threads(1)
    # the examples' runs: 60 steps, a checkpoint every 10, the kill after step 20 (quick: 12, 4, 4)
    steps, every, kill_after = ("12", "4", 4) if args.quick else ("60", "10", 20)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        reads = getitem_before_first_step(tmp)
        print(f"__getitem__ calls before the first step on a 20,000-item Dataset, batch 64: {reads}", file=sys.stderr)
        # quick: the harness once, on the lightest example (tests/integration/test_examples.py runs them all)
        hf = "skipped" if args.quick else str(kill_and_resume_identical(
            "hf_text_classification.py", tmp, ["--steps", steps, "--checkpoint-every", every], kill_after)).lower()
        stream = kill_and_resume_identical("stream.py", tmp, ["--steps", steps, "--checkpoint-every", every], kill_after)
        print(f"SIGKILL + resume bit-identical: hf {hf}, stream {stream}", file=sys.stderr)
        r2 = "skipped" if args.quick else f"{regression_r2(tmp):.4f}"
        print(f"regression example test R2 {r2}", file=sys.stderr)
    if not args.quick:
        side_by_side(200, 0, False)  # warm-up
    over = []
    for r in range(args.rounds):
        fast, generic = side_by_side(args.steps, r, False), side_by_side(args.steps, r, True)
        over.append(fast / generic)  # (eco generic seconds) / (eco fast seconds), each against its own yardstick
        print(f"round {r}: hand/eco fast {fast:.3f}, generic {generic:.3f}: generic over fast {fast / generic:.3f}",
              file=sys.stderr)
    g = statistics.median(over)
    print(f"RESULT getitem_before_first_step={reads} hf_resume_identical={hf} "
          f"stream_resume_identical={str(stream).lower()} regression_r2={r2} generic_over_fast={g:.3f}")


if __name__ == "__main__":
    main()
