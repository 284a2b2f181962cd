"""A user's own training program, as one would write it from the docs: their model, their data
(one of several loader kinds), `ecotrain.fit`. Killed by a real SIGKILL at a chosen step and run
again with `resume="auto"`, its final checkpoint must be the uninterrupted run's, byte for byte.

    python user_program.py KIND RUN_DIR [--kill-after STEP]

KIND: shuffle0 | shuffle2 (DataLoader(shuffle=True), 0 or 2 workers) | random_sampler (a
RandomSampler with the user's own generator) | weighted (WeightedRandomSampler) | batch_sampler
(a BatchSampler around a RandomSampler) | distributed (a DistributedSampler; run under torchrun) | hf_stream
(a Hugging Face `datasets` IterableDataset of 4 shards; under torchrun ecotrain splits it per rank) | builtin (a built-in dataset) | dataset (a map-style
Dataset) | stateful (torchdata's StatefulDataLoader) | iterable (an IterableDataset).
Used by tests/integration/test_user_programs.py and bench/user_resume.py.
"""

import os
import signal
import sys

import torch
from torch import nn
from torch.utils.data import (BatchSampler, DataLoader, DistributedSampler, RandomSampler, TensorDataset,
                              WeightedRandomSampler)

from ecotrain import Callback, Config, fit

N, BATCH, STEPS = 96, 16, 20  # 6 steps an epoch: a kill at step 3 is in epoch 0, at 14 in epoch 2
KINDS = ("shuffle0", "shuffle2", "random_sampler", "weighted", "batch_sampler", "builtin", "dataset", "stateful",
         "iterable", "hf_stream")
WORLD, RANK = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))  # torchrun's


def arrays():
    g = torch.Generator().manual_seed(1)
    return torch.randn(N, 6, generator=g), torch.randint(0, 3, (N,), generator=g)


class Items(torch.utils.data.Dataset):
    """Items with random augmentation in __getitem__ (ecotrain seeds it per item)."""

    def __init__(self):
        self.x, self.y = arrays()

    def __len__(self):
        return N

    def __getitem__(self, i):
        return self.x[i] + 0.01 * torch.randn(6), self.y[i]


class Stream(torch.utils.data.IterableDataset):
    """A stream of N items a pass that keeps its own position (state_dict), as a resumable stream must."""

    def __init__(self):
        self.x, self.y = arrays()
        self.pos = 0

    def __iter__(self):
        while self.pos < N:
            i = self.pos
            self.pos += 1
            yield self.x[i], self.y[i]
        self.pos = 0  # the next pass starts again

    def state_dict(self):
        return {"pos": self.pos}

    def load_state_dict(self, sd):
        self.pos = sd["pos"]


def data(kind: str):
    ds = TensorDataset(*arrays())
    if kind == "shuffle0":
        return DataLoader(ds, batch_size=BATCH, shuffle=True)
    if kind == "shuffle2":
        return DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=2)
    if kind == "random_sampler":
        return DataLoader(ds, batch_size=BATCH, sampler=RandomSampler(ds, generator=torch.Generator().manual_seed(5)))
    if kind == "weighted":
        w = torch.linspace(0.5, 2.0, N)
        return DataLoader(ds, batch_size=BATCH, sampler=WeightedRandomSampler(w, N))
    if kind == "batch_sampler":
        return DataLoader(ds, batch_sampler=BatchSampler(RandomSampler(ds), BATCH, drop_last=False))
    if kind == "distributed":  # each rank its share of every epoch, as a DDP program builds it
        sampler = DistributedSampler(ds, num_replicas=WORLD, rank=RANK, seed=3)
        return DataLoader(ds, batch_size=BATCH // WORLD, sampler=sampler, num_workers=1)
    if kind == "hf_stream":  # the `data` extra's datasets, offline: 4 shards of 24 rows, read as torch tensors
        import datasets

        x, y = arrays()
        table = datasets.Dataset.from_dict({"input": x.numpy(), "labels": y.numpy()})  # Sequential.forward(input)
        return table.to_iterable_dataset(num_shards=4).with_format("torch")
    if kind == "dataset":
        return Items()
    if kind == "stateful":
        from torchdata.stateful_dataloader import StatefulDataLoader
        return StatefulDataLoader(ds, batch_size=BATCH, shuffle=True)
    if kind == "iterable":
        return Stream()
    raise SystemExit(f"unknown kind {kind!r}; one of {', '.join(KINDS)}")


class KillAfter(Callback):
    """SIGKILL this process at the start of the step after `step` (its checkpoint is then complete)."""

    def __init__(self, step: int):
        self.step = step

    def on_step_start(self, state):
        if state.step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


# meta.json fields that record the run's history, not its state: how long it took, how often it was
# resumed, where its metrics log stood; everything else must match the uninterrupted run
HISTORY = ("train_seconds", "metrics_offset", "counters/resumes", "counters/data_wait_seconds",
           "counters/checkpoint_blocked_seconds", "counters/checkpoint_seconds", "last_log/loss")


def final_checkpoint_differences(a, b) -> list:
    """What differs between two runs' final checkpoints: tensors.safetensors byte for byte, meta.json
    field by field (the HISTORY fields aside). Empty when they are the same."""
    import json
    from pathlib import Path

    fa, fb = (sorted((Path(r) / "checkpoints").glob("step-*"))[-1] for r in (a, b))
    out = []
    if fa.name != fb.name:
        out.append(f"final checkpoint {fa.name} vs {fb.name}")
    if (fa / "tensors.safetensors").read_bytes() != (fb / "tensors.safetensors").read_bytes():
        from safetensors.torch import load_file
        ta, tb = load_file(str(fa / "tensors.safetensors")), load_file(str(fb / "tensors.safetensors"))
        out += [f"tensor {k}" for k in sorted(set(ta) | set(tb))
                if k not in ta or k not in tb or not torch.equal(ta[k], tb[k])] or ["tensors.safetensors bytes"]

    def walk(x, y, path):
        if path.strip("/") in HISTORY or path.strip("/").startswith(("counters/", "env/")) and "seconds" in path:
            return
        if isinstance(x, dict) and isinstance(y, dict):
            for k in sorted(set(x) | set(y)):
                walk(x.get(k), y.get(k), f"{path}/{k}")
        elif x != y:
            out.append(f"meta {path.strip('/')}: {str(x)[:60]} vs {str(y)[:60]}")

    walk(json.loads((fa / "meta.json").read_text()), json.loads((fb / "meta.json").read_text()), "")
    return out


def run(kind: str, run_dir, resume="auto", callbacks=()):
    """The user's program: `fit` of KIND's data and a small model (dropout: its masks must replay too)."""
    torch.manual_seed(0)
    tree = {"data": {"batch_size": BATCH}, "loop": {"max_steps": STEPS, "max_epochs": None, "log_every": 2},
            "ledger": {"enabled": False}, "checkpoint": {"every_n_steps": 1, "keep_last": STEPS}}
    if "WORLD_SIZE" in os.environ:  # under torchrun, at any world size
        tree["distributed"] = {"strategy": "ddp"}
    if kind == "hf_stream":  # dict batches: the model returns logits, not its own loss
        tree["task"] = {"name": "classification"}
    model = None
    if kind == "builtin":
        tree["data"].update(name="digits")
        tree["model"] = {"name": "mlp", "dropout": 0.2, "kwargs": {"hidden": [16]}}
    else:
        model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3))
    return fit(Config.model_validate(tree), model=model, data=None if kind == "builtin" else data(kind),
               callbacks=list(callbacks), run_dir=run_dir, resume=resume, quiet=True)


def main(argv):
    kind, run_dir = argv[0], argv[1]
    kill = int(argv[argv.index("--kill-after") + 1]) if "--kill-after" in argv else None
    run(kind, run_dir, callbacks=[KillAfter(kill)] if kill is not None else [])


if __name__ == "__main__":
    main(sys.argv[1:])
