"""Split MNIST-1D, class-incremental: 5 tasks of 2 classes, one 10-way head, no task id at test time.

Each strategy trains task 0, then tasks 1..4 in order, each task a real `ecotrain.fit` whose weights
start from the previous task's run folder (`init_from`) and whose methods read it (`from`,
`teacher`). After every task the model is tested on every task's test set; printed per strategy:
the final average accuracy over the 5 tasks and the average forgetting (per old task, its best
earlier accuracy minus the final one), next to joint training on all the data (the upper bound).

    .venv/bin/python bench/continual.py                 # every strategy, 20 epochs per task (~10 CPU-minutes)
    .venv/bin/python bench/continual.py --workers 8     # strategies in parallel processes
    .venv/bin/python bench/continual.py --only naive replay

Ends with `RESULT best=<strategy> best_acc=<f> best_forgetting=<f> joint_acc=<f> naive_acc=<f>`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

TASKS = 5
BUFFER = 500  # at most 10% of the 5,000 training examples

# Each strategy: the methods of task k (k >= 1) given the previous task's run folder; task 0 trains
# the base version with the same list, where `from`/`teacher` are absent.
STRATEGIES = {
    "naive": lambda prev: [],
    "replay": lambda prev: [_replay(prev)],
    "replay+lwf": lambda prev: [_replay(prev), _lwf(prev)],
    "ewc": lambda prev: [_ewc(prev)],
    "lwf": lambda prev: [_lwf(prev)],
    "adapters": lambda prev: [] if prev is None else [
        {"name": "adapters", "target_modules": ["conv1", "conv2", "conv3", "linear"], "r": 8, "alpha": 16,
         "merge": True}],
    "replay+lwf-old": lambda prev: [_replay(prev), _lwf(prev, on_new=False)],
}


def _from(prev):
    return {"from": str(prev)} if prev else {}


def _replay(prev, **kw):
    return {"name": "replay", "size": BUFFER, "ratio": 0.5, "selection": "balanced", **kw, **_from(prev)}


def _lwf(prev, alpha=1.0, on_new=True):
    return {"name": "lwf", "teacher": str(prev) if prev else None, "alpha": alpha, "temperature": 2.0, "on_new": on_new}


def _ewc(prev, beta=100.0):
    return {"name": "ewc", "beta": beta, "samples": 500, **_from(prev)}


def config(name: str, path: Path, methods: list, epochs: int, seed: int):
    from ecotrain.config import build_config

    return build_config({
        "name": name, "seed": seed, "device": "cpu",
        "data": {"name": "npz", "path": str(path), "num_classes": 10, "batch_size": 32, "val_split": 0.1},
        "model": {"name": "cnn", "kwargs": {"channels": 32}},
        "optim": {"lr": 3e-3},
        "loop": {"max_epochs": epochs, "log_every": 50},
        "ledger": {"enabled": False}, "logging": {"progress": "off"}, "checkpoint": {"at_end": False},
        "methods": methods})


def accuracy(model, x, y) -> float:
    import torch

    model.eval()
    with torch.no_grad():
        pred = torch.cat([model(x[i:i + 512]).argmax(-1) for i in range(0, len(x), 512)])
    return float((pred == y).float().mean())


def tests(data_dir: Path):
    import numpy as np
    import torch

    out = []
    for k in range(TASKS):
        with np.load(data_dir / f"task_{k}.npz") as z:
            out.append((torch.as_tensor(z["x_test"]), torch.as_tensor(z["y_test"]).long()))
    return out


def run_strategy(args) -> dict:
    """Train the 5 tasks in order; returns the accuracy matrix acc[after task k][on task j]."""
    name, data_dir, work, epochs, seed = args
    import torch

    from ecotrain import fit
    from ecotrain.config import safe_name

    torch.set_num_threads(1)
    test_sets, acc, prev = tests(Path(data_dir)), [], None
    t0 = time.perf_counter()
    for k in range(TASKS):
        run = Path(work) / name / f"task{k}"
        cfg = config(safe_name(f"{name}-t{k}"), Path(data_dir) / f"task_{k}.npz", STRATEGIES[name](prev),
                     epochs, seed)
        r = fit(cfg, run_dir=run, init_from=prev / "model.safetensors" if prev else None, overwrite=True, quiet=True)
        acc.append([accuracy(r.model, x, y) for x, y in test_sets])
        prev = run
    return {"name": name, "acc": acc, "seconds": time.perf_counter() - t0}


def run_joint(data_dir: Path, work: Path, epochs: int, seed: int) -> dict:
    import torch

    from ecotrain import fit

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    r = fit(config("joint", Path(data_dir) / "all.npz", [], epochs, seed), run_dir=Path(work) / "joint",
            overwrite=True, quiet=True)
    acc = [accuracy(r.model, x, y) for x, y in tests(Path(data_dir))]
    return {"name": "joint", "acc": [acc] * TASKS, "seconds": time.perf_counter() - t0}


def scores(acc: list[list[float]]) -> tuple[float, float]:
    """(final average accuracy, average forgetting of tasks 0..T-2)."""
    final = acc[-1]
    forgetting = [max(acc[k][j] for k in range(j, TASKS - 1)) - final[j] for j in range(TASKS - 1)]
    return sum(final) / TASKS, sum(forgetting) / len(forgetting)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", choices=list(STRATEGIES), help="strategies to run (default: all)")
    ap.add_argument("--epochs", type=int, default=20, help="epochs per task")
    ap.add_argument("--joint-epochs", type=int, default=20, help="epochs of joint training on all 5 tasks")
    ap.add_argument("--num-samples", type=int, default=6250, help="mnist1d samples (80%% train: 5,000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=1, help="strategies trained in parallel processes")
    ap.add_argument("--out", help="write the accuracy matrices here (JSON)")
    args = ap.parse_args()

    import logging

    logging.getLogger("ecotrain").setLevel(logging.WARNING)  # one line per --init-from otherwise
    from ecotrain.continual.scenario import write_tasks

    names = args.only or list(STRATEGIES)
    with tempfile.TemporaryDirectory(prefix="continual-") as work:
        data_dir = Path(work) / "data"
        write_tasks(data_dir, num_samples=args.num_samples, tasks=TASKS, seed=0)
        jobs = [(n, str(data_dir), work, args.epochs, args.seed) for n in names]
        t0 = time.perf_counter()
        if args.workers > 1:
            import multiprocessing as mp

            with mp.get_context("spawn").Pool(min(args.workers, len(jobs) + 1)) as pool:
                joint_res = pool.apply_async(run_joint, (data_dir, Path(work), args.joint_epochs, args.seed))
                results = pool.map(run_strategy, jobs)
                joint = joint_res.get()
        else:
            joint = run_joint(data_dir, Path(work), args.joint_epochs, args.seed)
            results = [run_strategy(j) for j in jobs]
        wall = time.perf_counter() - t0
    joint_acc, _ = scores(joint["acc"])
    print(f"Split MNIST-1D, class-incremental, {TASKS} tasks x 2 classes, buffer <= {BUFFER}, "
          f"{args.epochs} epochs/task, seed {args.seed}")
    print(f"{'strategy':<16} {'avg acc':>8} {'forgetting':>10} {'x joint':>8} {'seconds':>8}   acc per task (final)")
    rows = []
    for res in results:
        a, f = scores(res["acc"])
        rows.append((res["name"], a, f))
        per = " ".join(f"{v:.2f}" for v in res["acc"][-1])
        print(f"{res['name']:<16} {a:8.3f} {f:10.3f} {a / joint_acc:8.2f} {res['seconds']:8.1f}   {per}")
    print(f"{'joint':<16} {joint_acc:8.3f} {'-':>10} {1.0:8.2f} {joint['seconds']:8.1f}")
    print(f"wall: {wall:.0f} s")
    if args.out:
        Path(args.out).write_text(json.dumps({"joint": joint, "results": results}, indent=1))
    best = max((r for r in rows if r[0] != "naive"), key=lambda r: r[1], default=rows[0])
    naive = next((a for n, a, _ in rows if n == "naive"), float("nan"))
    print(f"RESULT best={best[0]} best_acc={best[1]:.4f} best_forgetting={best[2]:.4f} joint_acc={joint_acc:.4f} "
          f"naive_acc={naive:.4f}")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
