"""A model that writes down which samples it trained on: the first feature of each sample is its id
(tests/helpers/tars.py), appended to `$ECOTRAIN_IDS_DIR/ids-<pid>.txt` in training mode only (one
file per process: every rank and every resumed segment has its own). The id is not a feature."""

import os

from torch import nn


class IdRecorder(nn.Module):
    def __init__(self, dim: int = 8, classes: int = 4):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim - 1, 16), nn.ReLU(), nn.Linear(16, classes))
        self.out = os.path.join(os.environ["ECOTRAIN_IDS_DIR"], f"ids-{os.getpid()}.txt")

    def forward(self, x):
        if self.training:
            with open(self.out, "a") as f:
                f.write("".join(f"{int(i)}\n" for i in x[:, 0].tolist()))
        return self.net(x[:, 1:])


def seen(folder) -> list[int]:
    """Every id written under `folder`, by every process, in no particular order."""
    out: list[int] = []
    for p in sorted(os.listdir(folder)):
        if p.startswith("ids-"):
            with open(os.path.join(folder, p)) as f:
                out += [int(line) for line in f if line.strip()]
    return out
