"""Train on 200 WebDataset-style tar shards (docs/data.md, `data.name: shards:PATTERN`).

The shards are written with the standard library's tarfile, as `webdataset.TarWriter` or `tar`
write them: sample `000042` is two members, `000042.npy` (a noisy sine, float32[1, 64]) and
`000042.cls` (its class, 0-3). ecotrain indexes the shards at start-up, reads them in a seeded
shard order with rows shuffled in windows, decodes in 2 loader workers, and saves its position as
one batch index: kill it and run it again with --resume, and it seeks straight back.

    python examples/tar_shards.py --shards runs/tar-shards --run-dir runs/tars [--resume]
"""

from __future__ import annotations

import argparse
import io
import tarfile
from pathlib import Path

import numpy as np

import ecotrain

CLASSES, LENGTH = 4, 64


def write_shards(folder: Path, shards: int, per_shard: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    t = np.arange(LENGTH)
    for s in range(shards):
        with tarfile.open(folder / f"train-{s:06d}.tar", "w") as tar:
            for i in range(s * per_shard, (s + 1) * per_shard):
                label = int(rng.integers(CLASSES))
                x = np.sin(2 * np.pi * (label + 1) * t / LENGTH + rng.uniform(0, 2 * np.pi))
                x = (x + 0.8 * rng.normal(size=LENGTH)).astype(np.float32)[None, :]
                buf = io.BytesIO()
                np.save(buf, x)
                for name, data in ((f"{i:06d}.npy", buf.getvalue()), (f"{i:06d}.cls", str(label).encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shards", type=Path, default=Path("runs/tar-shards"))
    ap.add_argument("--run-dir", type=Path, default=Path("runs/tars"))
    ap.add_argument("--count", type=int, default=200, help="shards to write")
    ap.add_argument("--per-shard", type=int, default=20)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--checkpoint-every", type=int, default=50)
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args()
    if not any(args.shards.glob("*.tar")):
        write_shards(args.shards, args.count, args.per_shard)
    config = ecotrain.Config.model_validate({
        "name": "tar-shards", "seed": 0,
        "data": {"name": f"shards:{args.shards}/train-{{000000..{args.count - 1:06d}}}.tar", "batch_size": 64,
                 "workers": 2, "shuffle_window": 512},
        "model": {"name": "cnn"}, "optim": {"lr": 0.01},
        "loop": {"max_steps": args.steps, "max_epochs": None, "eval_every": 100},
        "checkpoint": {"every_n_steps": args.checkpoint_every},
    })
    result = ecotrain.fit(config, run_dir=args.run_dir, resume="auto" if args.resume else None, quiet=True,
                          overwrite=not args.resume)
    s = result.summary
    print(f"samples={s['samples_seen']} samples_per_second={s['samples_per_second']} "
          f"val_accuracy={s['val_accuracy']:.4f} test_accuracy={s['test_accuracy']:.4f}")


if __name__ == "__main__":
    main()
