"""Split MNIST-1D, class-incremental: 5 tasks of 2 classes, one 10-way head, no task id at test time.

Each strategy trains task 0, then tasks 1..4 in order, each task a real `ecotrain.fit` whose weights
start from the previous task's run folder (`init_from`) and whose methods read it (`from`,
`teacher`). After every task the model is tested on every task's test set; printed per strategy:
the final average accuracy over the 5 tasks and the average forgetting (per old task, its best
earlier accuracy minus the final one), next to joint training on all the data (the upper bound).

Under the evaluation protocol (docs/evaluation.md): every strategy runs on the design seed, and
the strategy is chosen by its final average accuracy on the tasks' *validation* splits (each task
run's own seeded 10% hold-out); the test sets are not read to choose. The chosen strategy, naive
fine-tuning and joint training then run on fresh seeds, and their test figures are reported as
the mean and 95% interval over those seeds.

    .venv/bin/python bench/continual.py                 # 20 epochs per task (~25 CPU-minutes)
    .venv/bin/python bench/continual.py --workers 2     # runs in parallel processes
    .venv/bin/python bench/continual.py --only naive replay
    .venv/bin/python bench/continual.py --quick         # naive and replay, 1 epoch, 1,250 samples, seeds 0 and 10

Ends with `RESULT selected_on=val design_seeds=.. fresh_seeds=.. best=<strategy> best_acc=<mean>
best_acc_ci=<half-width> best_forgetting=<mean> joint_acc=<mean> naive_acc=<mean> x_joint=<mean ratio>`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
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
    # DER++ (Buzzega et al. 2020): the buffer keeps each example's logits from when it was stored
    "der++": lambda prev: [_replay(prev, logits=True, logit_weight=0.5)],
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


def vals(data_dir: Path, seed: int, epochs: int):
    """Each task's validation split, as its own run holds it out (seeded by the run's seed)."""
    from ecotrain.data import load_data

    out = []
    for k in range(TASKS):
        val = load_data(config(f"val-t{k}", Path(data_dir) / f"task_{k}.npz", [], epochs, seed)).val
        out.append((val.x, val.y))
    return out


def run_strategy(args) -> dict:
    """Train the 5 tasks in order; returns the accuracy matrix acc[after task k][on task j], on the
    test sets (`split="test"`) or on the validation splits (`split="val"`: design)."""
    name, data_dir, work, epochs, seed, split = args
    import torch

    from ecotrain import fit
    from ecotrain.config import safe_name

    torch.set_num_threads(1)
    test_sets = tests(Path(data_dir)) if split == "test" else vals(Path(data_dir), seed, epochs)
    acc, prev = [], None
    t0 = time.perf_counter()
    for k in range(TASKS):
        run = Path(work) / f"{name}-s{seed}" / f"task{k}"
        cfg = config(safe_name(f"{name}-t{k}"), Path(data_dir) / f"task_{k}.npz", STRATEGIES[name](prev),
                     epochs, seed)
        r = fit(cfg, run_dir=run, init_from=prev / "model.safetensors" if prev else None, overwrite=True, quiet=True)
        acc.append([accuracy(r.model, x, y) for x, y in test_sets])
        prev = run
    return {"name": name, "seed": seed, "acc": acc, "seconds": time.perf_counter() - t0}


def run_joint(args) -> dict:
    data_dir, work, epochs, seed = args
    import torch

    from ecotrain import fit

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    r = fit(config("joint", Path(data_dir) / "all.npz", [], epochs, seed), run_dir=Path(work) / f"joint-s{seed}",
            overwrite=True, quiet=True)
    acc = [accuracy(r.model, x, y) for x, y in tests(Path(data_dir))]
    return {"name": "joint", "seed": seed, "acc": [acc] * TASKS, "seconds": time.perf_counter() - t0}


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
    ap.add_argument("--design-seeds", default="0", help="seeds the strategy is chosen on (validation splits)")
    ap.add_argument("--fresh-seeds", default="10-12", help="seeds the test figures are reported on")
    ap.add_argument("--workers", type=int, default=1, help="runs trained in parallel processes")
    ap.add_argument("--out", help="write the accuracy matrices here (JSON)")
    ap.add_argument("--quick", action="store_true", help="tiny: checks the bench runs, not a figure")
    args = ap.parse_args()
    if args.quick:
        args.only, args.epochs, args.joint_epochs, args.num_samples = ["naive", "replay"], 1, 1, 1250
        args.design_seeds, args.fresh_seeds = "0", "10"

    import logging

    logging.getLogger("ecotrain").setLevel(logging.WARNING)  # one line per --init-from otherwise
    from ecotrain.continual.scenario import write_tasks
    from ecotrain.base.stats import mean_ci
    from ecotrain.seeds.sweep import parse_seeds

    design_seeds, fresh_seeds = parse_seeds(args.design_seeds), parse_seeds(args.fresh_seeds)
    if set(design_seeds) & set(fresh_seeds):
        sys.exit("bench/continual.py: --fresh-seeds must be disjoint from --design-seeds (docs/evaluation.md)")
    names = args.only or list(STRATEGIES)
    with tempfile.TemporaryDirectory(prefix="continual-") as work:
        data_dir = Path(work) / "data"
        write_tasks(data_dir, num_samples=args.num_samples, tasks=TASKS, seed=0)
        t0 = time.perf_counter()
        pool = None
        if args.workers > 1:
            import multiprocessing as mp

            pool = mp.get_context("spawn").Pool(args.workers)
        run_all = pool.map if pool else (lambda f, jobs: [f(j) for j in jobs])
        design = run_all(run_strategy, [(n, str(data_dir), work, args.epochs, s, "val")
                                        for n in names for s in design_seeds])
        val_score = {n: statistics.fmean(scores(r["acc"])[0] for r in design if r["name"] == n) for n in names}
        others = [n for n in names if n != "naive"] or names
        best = max(others, key=lambda n: val_score[n])
        report = sorted({best, "naive"} & set(names) | {best})
        fresh = run_all(run_strategy, [(n, str(data_dir), work, args.epochs, s, "test")
                                       for n in report for s in fresh_seeds])
        joint = run_all(run_joint, [(data_dir, Path(work), args.joint_epochs, s) for s in fresh_seeds])
        if pool:
            pool.close()
        wall = time.perf_counter() - t0
    print(f"Split MNIST-1D, class-incremental, {TASKS} tasks x 2 classes, buffer <= {BUFFER}, "
          f"{args.epochs} epochs/task")
    print(f"design (seeds {args.design_seeds}), final average accuracy on the validation splits:")
    for n in names:
        print(f"  {n:<16} {val_score[n]:.3f}" + ("   <- chosen" if n == best else ""))
    joint_by_seed = {r["seed"]: scores(r["acc"])[0] for r in joint}
    print(f"test, fresh seeds {args.fresh_seeds}: mean [95% interval]")
    print(f"{'strategy':<16} {'avg acc':>26} {'forgetting':>26} {'x joint':>8}")
    figs = {}
    for n in report:
        runs = sorted((r for r in fresh if r["name"] == n), key=lambda r: r["seed"])
        acc = mean_ci([scores(r["acc"])[0] for r in runs])
        forg = mean_ci([scores(r["acc"])[1] for r in runs])
        ratio = mean_ci([scores(r["acc"])[0] / joint_by_seed[r["seed"]] for r in runs])
        figs[n] = (acc, forg, ratio)
        print(f"{n:<16} {str(acc):>26} {str(forg):>26} {ratio.mean:8.2f}")
    joint_ci = mean_ci(list(joint_by_seed.values()))
    print(f"{'joint':<16} {str(joint_ci):>26}")
    print(f"wall: {wall:.0f} s")
    if args.out:
        Path(args.out).write_text(json.dumps({"design": design, "fresh": fresh, "joint": joint}, indent=1))
    acc, forg, ratio = figs[best]
    naive = figs["naive"][0].mean if "naive" in figs else float("nan")
    print(f"RESULT selected_on=val design_seeds={args.design_seeds} fresh_seeds={args.fresh_seeds} best={best} "
          f"best_acc={acc.mean:.4f} best_acc_ci={acc.half:.4f} best_forgetting={forg.mean:.4f} "
          f"joint_acc={joint_ci.mean:.4f} naive_acc={naive:.4f} x_joint={ratio.mean:.3f} "
          f"x_joint_ci_low={ratio.low:.3f} x_joint_ci_high={ratio.high:.3f}")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
