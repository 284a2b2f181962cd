"""Seeded train/validation splits, stratified by class for classification."""

from __future__ import annotations

import numpy as np
import torch


def stratified_split(labels: torch.Tensor, fraction: float, seed: int, stratify: bool = True):
    """Return `(keep_idx, held_idx)`: `fraction` of each class held out (at least one per class
    with two or more samples), the same for the same seed."""
    n = len(labels)
    rng = np.random.default_rng(seed)
    if fraction <= 0 or n == 0:  # nothing to hold out (the caller reports an empty split)
        return torch.arange(n), torch.arange(0)
    if not stratify:
        perm = rng.permutation(n)
        k = max(1, round(n * fraction))
        return torch.from_numpy(np.sort(perm[k:])), torch.from_numpy(np.sort(perm[:k]))
    y = labels.numpy()
    held = []
    for c in np.unique(y):
        members = np.flatnonzero(y == c)
        rng.shuffle(members)
        k = round(len(members) * fraction)
        if k == 0 and len(members) >= 2:
            k = 1
        held.append(members[:k])
    held_idx = np.sort(np.concatenate(held))
    keep_idx = np.setdiff1d(np.arange(n), held_idx)
    return torch.from_numpy(keep_idx), torch.from_numpy(held_idx)
