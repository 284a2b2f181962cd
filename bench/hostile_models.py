"""Hostile model files and tied weights, end to end (issue 49).

1. Every payload of tests/helpers/payloads.py (a file that creates a marker when read carelessly: eight
   forms of `.pt2`, a `.pt` for --init-from, checkpoint and run folders, an `.npz`) through the real CLI:
   each must be refused and its marker never made (`payloads_run`). The `.pt2` ones are also opened by
   plain `torch.export.load` in a child process, to show that they are live (`payloads_live_in_torch`).
2. Tied weights: a hand-tied model and a transformers GPT-2 (`lm_head` is `wte`) trained in a child
   process that is SIGKILLed after its first checkpoint and restarted with resume="auto"; its final
   weights compared with an uninterrupted run's (`tied_resume_identical`).
3. Parity: an exported program that returns NaN where the eager model is finite is refused
   (`nan_parity_refused`).

    python bench/hostile_models.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.helpers import payloads  # noqa: E402  (the suite's own hostile files)
from tests.hostile.cases import TINY  # noqa: E402

from ecotrain.base.errors import EcotrainError  # noqa: E402
from ecotrain.export import parity  # noqa: E402
from ecotrain.base.tensorfile import read_tensors  # noqa: E402

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ecotrain", *map(str, args)], capture_output=True, text=True,
                          env=ENV, timeout=600)


QUICK = ("pt2_shape_expression_eval", "init_from_pickle", "checkpoint_with_pickle")  # one of each reader


def payload_figures(tmp: Path, quick: bool) -> dict:
    (tmp / "tiny.yaml").write_text(TINY)
    for step in (cli("fit", tmp / "tiny.yaml", "--run-dir", tmp / "run"),
                 cli("export", tmp / "run", "--format", "pt2", "--out", tmp / "clean.pt2", "--no-card")):
        if step.returncode:
            raise SystemExit(f"hostile_models: setting up failed: {step.stderr.strip().splitlines()[-1]}")
    np.savez(tmp / "q.npz", x=load_digits().data[:8].astype(np.float32))
    cases = payloads.build_all(tmp, tmp / "run", tmp / "clean.pt2", tmp / "q.npz")
    if quick:
        cases = {k: v for k, v in cases.items() if k in QUICK}
    refused, tracebacks = 0, 0
    for name, args in cases.items():
        done = cli(*args)
        refused += done.returncode in (2, 3)
        tracebacks += "Traceback" in done.stderr
        print(f"  {name:34s} exit {done.returncode}  {(done.stderr.strip().splitlines() or [''])[-1][:110]}")
    ran = payloads.markers_made(tmp)
    live = 0
    for name in [] if quick else payloads.PT2:  # the control: torch alone runs them
        probe = ("import sys, torch\ntry:\n    ep = torch.export.load(sys.argv[1])\n    ep.module()(torch.zeros(2, 64))\n"
                 "except Exception:\n    pass\n")
        subprocess.run([sys.executable, "-c", probe, str(tmp / f"{name}.pt2")], capture_output=True, env=ENV,
                       timeout=300)
        live += name in payloads.markers_made(tmp)
    return {"payloads_run": len(ran), "payloads": len(cases), "payloads_refused": refused,
            "payloads_live_in_torch": live, "pt2_payloads": 0 if quick else len(payloads.PT2),
            "tracebacks": tracebacks, "file_kinds_checked": 3 if quick else 5}  # .pt2 .pt checkpoint run .npz


TRAIN = r'''
import sys, torch
from torch import nn
from ecotrain import Config, fit

kind, run, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])

class TiedLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.mix = nn.Embedding(11, 16), nn.Linear(16, 16)
        self.head = nn.Linear(16, 11, bias=False)
        self.head.weight = self.wte.weight
    def forward(self, x):
        return self.head(torch.tanh(self.mix(self.wte(x))))

class Items(torch.utils.data.Dataset):
    def __init__(self, items): self.items = items
    def __len__(self): return len(self.items)
    def __getitem__(self, i): return self.items[i]

torch.manual_seed(0)
x = torch.randint(0, 11, (160, 8), generator=torch.Generator().manual_seed(1))
if kind == "gpt2":
    import transformers
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=11, n_positions=8, n_embd=16, n_layer=2,
                                                                 n_head=2, bos_token_id=0, eos_token_id=0))
    items = [{"input_ids": r, "labels": r} for r in x]
    data = {"train": Items(items[:128]), "val": Items(items[128:144]), "test": Items(items[144:])}
    task = {}
else:
    model, y = TiedLM(), torch.roll(x, -1, 1)
    data = {"train": (x[:128], y[:128]), "val": (x[128:144], y[128:144]), "test": (x[144:], y[144:])}
    task = {"task": {"name": "language_model"}}
cfg = Config.model_validate({"seed": 2, **task, "optim": {"lr": 1e-2}, "data": {"batch_size": 16},
                             "loop": {"max_steps": steps, "max_epochs": None, "eval_every": 8},
                             "checkpoint": {"every_n_steps": 4, "keep_last": 50}, "logging": {"progress": "off"}})
fit(cfg, model=model, data=data, run_dir=run, quiet=True, resume="auto")
'''


def tied_identical(tmp: Path, kind: str, steps: int) -> bool:
    script = tmp / "train_tied.py"
    script.write_text(TRAIN)
    full, cut = tmp / f"{kind}-full", tmp / f"{kind}-cut"
    subprocess.run([sys.executable, str(script), kind, str(full), str(steps)], check=True, env=ENV, timeout=600)
    child = subprocess.Popen([sys.executable, str(script), kind, str(cut), str(steps)], env=ENV)
    while child.poll() is None and not list((cut / "checkpoints").glob("step-*")):
        time.sleep(0.02)
    child.send_signal(signal.SIGKILL)  # after the first checkpoint, mid-run
    child.wait()
    subprocess.run([sys.executable, str(script), kind, str(cut), str(steps)], check=True, env=ENV, timeout=600)
    a, b = read_tensors(full / "model.safetensors"), read_tensors(cut / "model.safetensors")
    tied = any(a[k] is a[j] for k in a for j in a if k < j)
    return tied and a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def nan_parity_refused() -> bool:
    eager = nn.Linear(4, 3)
    both = parity.Compared(eager, lambda x: eager(x) * torch.tensor([1.0, float("nan"), 1.0]))
    both(torch.randn(5, 4))
    record = {"program": {"nonfinite": both.nonfinite, "relative_diff": 0.0, "max_abs_diff": both.max_abs_diff},
              "relative_diff": both.max_abs_diff / max(1.0, both.max_abs_eager), "max_abs_diff": both.max_abs_diff}
    try:
        parity.enforce(record, parity.DEFAULT_TOLERANCE, "the program")
    except EcotrainError:
        return True
    return False


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer steps (the test suite runs this)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        fig = payload_figures(tmp, args.quick)
        steps = 8 if args.quick else 48
        kinds = ["hand"] + (["gpt2"] if not args.quick else [])
        identical = all(tied_identical(tmp, k, steps) for k in kinds)
    print(f"RESULT payloads_run={fig['payloads_run']} payloads={fig['payloads']} "
          f"payloads_refused={fig['payloads_refused']} payloads_live_in_torch={fig['payloads_live_in_torch']}/"
          f"{fig['pt2_payloads']} file_kinds_checked={fig['file_kinds_checked']} tracebacks={fig['tracebacks']} "
          f"tied_resume_identical={str(identical).lower()} tied_models={'+'.join(kinds)} "
          f"nan_parity_refused={str(nan_parity_refused()).lower()}")


if __name__ == "__main__":
    main()
