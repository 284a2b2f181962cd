"""Tabular regression from a CSV file: generated house-price-like data, read with NumPy, a small MLP
of your own, MSE loss, R2 on the held-out test split. Float targets make ecotrain's task `regression`
(MSE, MAE and R2 metrics, computed exactly over each split).

    python examples/tabular_regression.py --csv runs/houses.csv --run-dir runs/regression
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from torch import nn

import ecotrain

COLUMNS = ["rooms", "area", "age", "distance", "floor", "garden"]


def write_csv(path: Path, n: int, seed: int) -> None:
    """A CSV of n rows: six features and a price that depends on them non-linearly, plus noise."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, len(COLUMNS)))
    price = (2.0 * x[:, 0] + 1.5 * x[:, 1] - x[:, 2] + np.sin(2 * x[:, 3]) + 0.5 * x[:, 4] * x[:, 5]
             + 0.1 * rng.normal(size=n))
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savetxt(path, np.column_stack([x, price]), delimiter=",", header=",".join([*COLUMNS, "price"]), comments="")


def read_csv(path: Path) -> tuple[np.ndarray, np.ndarray]:
    table = np.loadtxt(path, delimiter=",", skiprows=1, dtype=np.float32)
    return table[:, :-1], table[:, -1]


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--csv", default="runs/houses.csv")
    p.add_argument("--run-dir", default="runs/regression")
    p.add_argument("--rows", type=int, default=4000)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    path = Path(args.csv)
    write_csv(path, args.rows, seed=args.seed)
    x, y = read_csv(path)
    n_test, n_val = len(x) // 5, len(x) // 10  # held out before anything trains; the test read once, at the end
    splits = {"test": (x[:n_test], y[:n_test]), "val": (x[n_test:n_test + n_val], y[n_test:n_test + n_val]),
              "train": (x[n_test + n_val:], y[n_test + n_val:])}
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(len(COLUMNS), 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    cfg = ecotrain.Config.model_validate({
        "name": "regression", "seed": args.seed, "data": {"batch_size": 64}, "optim": {"lr": 3e-3},
        "schedule": {"name": "cosine"}, "loop": {"max_epochs": args.epochs, "log_every": 20},
        "early_stopping": {"enabled": True, "monitor": "val_r2", "mode": "max", "patience": 8},
        "ledger": {"energy": "off"},
    })
    result = ecotrain.fit(cfg, model=model, data=splits, run_dir=args.run_dir, quiet=True, overwrite=True)
    s = result.summary
    print(f"regression: task={result.state.task.name} test_r2={s['test_r2']:.4f} test_mae={s['test_mae']:.4f}")
    return s


if __name__ == "__main__":
    main()
