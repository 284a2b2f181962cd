"""Exact and near-duplicate removal: the train split without repeated samples, before training.

    methods:
      - name: dedup          # list it first: later data methods order what it keeps
        near: true           # also near-duplicates; false: exact copies only
        points: 16           # near key: the z-normalised sample averaged down to 16 points,
        step: 0.25           #   rounded to a grid of 0.25 standard deviations

Exact key: the sample's bytes (dtype, shape, values). Near key (floating inputs only): the sample
z-normalised (so a copy that is shifted or rescaled in amplitude matches), averaged down to `points`
values and rounded to `step`; two samples with the same key are near-duplicates. It is a key, not
a distance: two copies straddling a rounding boundary are not caught. The first of each group is
kept (the split's order); a group whose samples carry different labels is counted as a label
conflict. The count goes to summary.json `methods.dedup`.

When it helps: scraped or merged data with repeats, which cost FLOPs every epoch and over-weight
what is repeated. Risks: a `step` too coarse merges distinct samples. Cost: one pass over the train
split at start-up (hashing, no model FLOPs). The order stays the engine's seeded shuffle over the
kept samples, and the kept set is a function of the data and the config; the checkpoint holds
its digest, so a resume over different data fails instead of drifting.
"""

from __future__ import annotations

import hashlib

import torch
import torch.nn.functional as F

from ecotrain.data.sources import subset
from ecotrain.base.errors import CheckpointError
from ecotrain.base.log import log
from ecotrain.methods.base import Method
from ecotrain.methods.sampling import over_subset

_CHUNK = 1024


def exact_key(x: torch.Tensor, y: torch.Tensor) -> bytes:
    return hashlib.sha256(str((x.dtype, tuple(x.shape))).encode() + x.contiguous().numpy().tobytes()).digest()


def near_keys(x: torch.Tensor, points: int, step: float) -> list[bytes]:
    """One key per row of `x` (a batch): z-normalised, pooled to `points`, rounded to `step`."""
    z = x.reshape(len(x), -1).double()
    z = (z - z.mean(1, keepdim=True)) / z.std(1, keepdim=True).clamp_min(1e-12)
    if z.shape[1] > points:
        z = F.adaptive_avg_pool1d(z.unsqueeze(1), points).squeeze(1)
    q = torch.round(z / step).to(torch.int64)
    return [hashlib.sha256(row.numpy().tobytes()).digest() for row in q]


def find_duplicates(source, near: bool, points: int, step: float) -> tuple[torch.Tensor, dict]:
    """(indices kept, counts) over `source`, in its order; the first of each group is kept."""
    seen_exact: dict[bytes, int] = {}
    seen_near: dict[bytes, int] = {}
    kept, labels = [], {}
    exact = near_n = conflicts = 0
    for start in range(0, len(source), _CHUNK):
        idx = torch.arange(start, min(start + _CHUNK, len(source)))
        xs, ys = source.take(idx)
        nears = near_keys(xs, points, step) if near and xs.is_floating_point() else [None] * len(idx)
        for i, x, y, nk in zip(idx.tolist(), xs, ys, nears):
            label = y.numpy().tobytes()
            ek = exact_key(x, y)
            first = seen_exact.get(ek)
            if first is None and nk is not None:
                first = seen_near.get(nk)
                near_n += first is not None
            else:
                exact += first is not None
            if first is not None:
                conflicts += labels[first] != label
                continue
            seen_exact[ek] = i
            if nk is not None:
                seen_near[nk] = i
            labels[i] = label
            kept.append(i)
    counts = {"samples": len(source), "kept": len(kept), "exact_dropped": exact, "near_dropped": near_n,
              "label_conflicts": conflicts}
    return torch.tensor(kept, dtype=torch.int64), counts


class Dedup(Method):
    needs = ("xy",)  # (x, y) tensor batches of a classification-like task (assemble.check_methods_fit)
    def __init__(self, cfg, run=None, trained=None):
        self.key, self.near, self.points, self.step = "dedup", cfg.near, cfg.points, cfg.step
        self.counts: dict = {}
        self.digest = ""

    def data(self, source, sampler):
        keep, self.counts = find_duplicates(source, self.near, self.points, self.step)
        self.digest = hashlib.sha256(keep.numpy().tobytes()).hexdigest()[:16]
        dropped = len(source) - len(keep)
        log.info(f"dedup: dropped {dropped} of {len(source)} train samples ({self.counts['exact_dropped']} exact, "
                 f"{self.counts['near_dropped']} near; {self.counts['label_conflicts']} with another label)")
        if not dropped:
            return source, sampler
        return subset(source, keep), over_subset(sampler, keep, "dedup")

    def summary(self) -> dict:
        return dict(self.counts)

    def state_dict(self) -> dict:
        return {"kept": self.counts.get("kept", 0), "digest": self.digest}

    def load_state_dict(self, sd: dict) -> None:
        if sd.get("digest") != self.digest:
            raise CheckpointError(f"methods.dedup: the checkpoint kept {sd.get('kept')} samples (digest "
                                  f"{sd.get('digest')}), this run {self.counts.get('kept')} ({self.digest}); resume "
                                  "with the data and dedup settings it was saved with")
