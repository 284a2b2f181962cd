"""An IterableDataset stream: samples generated on the fly (a sensor feed, a log tail, a web
dataset), batched by torchdata's StatefulDataLoader, which ecotrain checkpoints with the run. The
stream keeps its own position (`state_dict`/`load_state_dict`), so a run killed mid-epoch resumes
on exactly the next sample. A stream has no length: the budget is `loop.max_steps`.

    python examples/stream.py --run-dir runs/stream
    python examples/stream.py --run-dir runs/stream --resume   # after a kill: exact resume

Needs torchdata (the `stream` extra): pip install 'ecotrain[stream]'.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from torch import nn

import ecotrain

FEATURES, CLASSES = 12, 3


def sample(seed: int, epoch: int, i: int) -> tuple[torch.Tensor, int]:
    """Sample i of a pass: its class sets the mean of a noisy feature vector (seeded per sample)."""
    rng = np.random.default_rng([seed, epoch, i])
    label = int(rng.integers(CLASSES))
    centre = np.linspace(-1, 1, FEATURES) * (label - 1)
    return torch.from_numpy((centre + rng.normal(size=FEATURES)).astype(np.float32)), label


class SensorStream(torch.utils.data.IterableDataset):
    """`per_pass` samples a pass, a new pass each `iter()`; its position is its state."""

    def __init__(self, per_pass: int, seed: int = 0):
        self.per_pass, self.seed = per_pass, seed
        self.epoch, self.pos, self._restored = 0, 0, False

    def __iter__(self):
        if not self._restored:
            self.pos = 0
        self._restored = False
        while self.pos < self.per_pass:
            i, self.pos = self.pos, self.pos + 1
            yield sample(self.seed, self.epoch, i)
        self.epoch += 1

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, sd: dict) -> None:
        self.epoch, self.pos, self._restored = sd["epoch"], sd["pos"], True


def validation(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = zip(*(sample(seed=10_000, epoch=0, i=i) for i in range(n)))
    return torch.stack(xs), torch.tensor(ys)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run-dir", default="runs/stream")
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--per-pass", type=int, default=1000)
    p.add_argument("--resume", action="store_true", help="continue from the run folder's newest checkpoint")
    p.add_argument("--checkpoint-every", type=int, default=15)
    args = p.parse_args(argv)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, CLASSES))
    cfg = ecotrain.Config.model_validate({
        "name": "stream", "data": {"batch_size": 32}, "optim": {"lr": 1e-2},
        "loop": {"max_steps": args.steps, "eval_every": 40, "log_every": 10},
        "checkpoint": {"every_n_steps": args.checkpoint_every}, "ledger": {"energy": "off"},
    })
    result = ecotrain.fit(cfg, model=model, data={"train": SensorStream(args.per_pass), "val": validation(500)},
                          run_dir=args.run_dir, quiet=True, resume="auto" if args.resume else None,
                          overwrite=not args.resume)
    s = result.summary
    print(f"stream: steps={s['steps']} epochs={s['epochs']} val_accuracy={s['val_accuracy']:.3f}")
    return s


if __name__ == "__main__":
    main()
