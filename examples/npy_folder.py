"""A folder of .npy files read lazily by your own Dataset: each `__getitem__` loads one file, so the
data never has to fit in memory. ecotrain reads 17 items to start, not the folder (item 0 for the
task's shape, 16 sampled for the fingerprint; the labels come from the Dataset's `labels`
attribute, no file opened), and items come back as
`(x, y, meta)`: the metadata (the file name) rides along with the batch, untouched.

    python examples/npy_folder.py --folder runs/signals --run-dir runs/npy
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np
import torch
from torch import nn

import ecotrain

CLASSES, LENGTH = 4, 64


def write_folder(folder: Path, n: int, seed: int) -> None:
    """n signals as signal-00000.npy ... and labels.csv (file, label): sines of four frequencies in noise."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    t = np.arange(LENGTH)
    with open(folder / "labels.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["file", "label"])
        for i in range(n):
            label = int(rng.integers(CLASSES))
            x = np.sin(2 * np.pi * (label + 1) * t / LENGTH + rng.uniform(0, 2 * np.pi)) + 0.8 * rng.normal(size=LENGTH)
            np.save(folder / f"signal-{i:05d}.npy", x.astype(np.float32)[None, :])
            w.writerow([f"signal-{i:05d}.npy", label])


class NpyFolder(torch.utils.data.Dataset):
    """One .npy file per item, loaded on access; `labels` from the folder's labels.csv (no file opened)."""

    def __init__(self, folder: Path, rows: slice = slice(None)):
        self.folder = Path(folder)
        with open(self.folder / "labels.csv", newline="") as f:
            table = list(csv.DictReader(f))[rows]
        self.files = [r["file"] for r in table]
        self.labels = [int(r["label"]) for r in table]
        self.reads = 0

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        self.reads += 1
        x = torch.from_numpy(np.load(self.folder / self.files[i]))
        return x, self.labels[i], {"file": self.files[i]}


def small_cnn() -> nn.Module:
    return nn.Sequential(nn.Conv1d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool1d(2),
                         nn.Conv1d(16, 32, 5, padding=2), nn.ReLU(), nn.AdaptiveAvgPool1d(1), nn.Flatten(),
                         nn.Linear(32, CLASSES))


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--folder", default="runs/signals")
    p.add_argument("--run-dir", default="runs/npy")
    p.add_argument("--files", type=int, default=1500)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--workers", type=int, default=0)
    args = p.parse_args(argv)

    write_folder(Path(args.folder), args.files, seed=0)
    n = args.files
    train, val, test = (NpyFolder(Path(args.folder), s) for s in
                        (slice(0, int(0.7 * n)), slice(int(0.7 * n), int(0.85 * n)), slice(int(0.85 * n), n)))
    torch.manual_seed(0)
    cfg = ecotrain.Config.model_validate({
        "name": "npy", "data": {"batch_size": 50, "workers": args.workers}, "optim": {"lr": 1e-2},
        "loop": {"max_epochs": args.epochs, "log_every": 10}, "ledger": {"energy": "off"},
    })
    result = ecotrain.fit(cfg, model=small_cnn(), data={"train": train, "val": val, "test": test},
                          run_dir=args.run_dir, quiet=True, overwrite=True)
    s = result.summary
    print(f"npy: task={result.state.task.name} test_accuracy={s['test_accuracy']:.3f} "
          f"train_reads={train.reads} files={len(train)}")
    return s


if __name__ == "__main__":
    main()
