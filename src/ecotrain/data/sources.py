"""What the loop reads from: a `Source` returns a whole batch `(x, y)` for a tensor of indices.

In-memory arrays take the fast path (`x[idx]`, no per-sample Python); any map-style
`torch.utils.data.Dataset` works through `MapSource` with `default_collate`. While the loader
fetches a training batch (`item_seeds`), each item of a user Dataset is read with the global
generators seeded by (seed, epoch, sample index): random augmentation in `__getitem__` is then the
same in the training process and in any loader worker, whichever worker reads the item.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
from dataclasses import dataclass, field
from typing import Optional, Protocol

import numpy as np
import torch
from torch.utils.data import Dataset, default_collate

from ecotrain.errors import DataError

_item_key: Optional[tuple[int, int]] = None  # (seed, epoch) while a training batch is fetched


@contextlib.contextmanager
def item_seeds(seed: int, epoch: int):
    """Within this block, `MapSource.take` seeds each item by (seed, epoch, index)."""
    global _item_key
    saved, _item_key = _item_key, (seed, epoch)
    try:
        yield
    finally:
        _item_key = saved


def item_seed(seed: int, epoch: int, index: int) -> int:
    """A 63-bit seed that differs for every (seed, epoch, index): splitmix64's constants."""
    return ((seed * 0x9E3779B97F4A7C15) ^ (epoch * 0xBF58476D1CE4E5B9) ^ (index * 0x94D049BB133111EB)) & (2**63 - 1)


def _seeded_items(ds, indices: list[int], seed: int, epoch: int) -> list:
    """`[ds[i] for i in indices]`, torch's CPU, NumPy's and Python's global generators seeded per
    item, and given back afterwards (the training process's dropout must not see the reseeding)."""
    saved = torch.get_rng_state(), np.random.get_state(), random.getstate()
    try:
        out = []
        for i in indices:
            s = item_seed(seed, epoch, i)
            torch.default_generator.manual_seed(s)  # not torch.manual_seed: that reseeds CUDA too
            np.random.seed(s & 0xFFFFFFFF)
            random.seed(s)
            out.append(ds[i])
        return out
    finally:
        torch.set_rng_state(saved[0])
        np.random.set_state(saved[1])
        random.setstate(saved[2])


class Source(Protocol):
    def __len__(self) -> int: ...
    def take(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...
    def labels(self) -> torch.Tensor: ...


class ArraySource:
    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def take(self, idx):
        # index_select: ~30% less per call than x[idx] for a 1-D index (more under deterministic mode)
        return self.x.index_select(0, idx), self.y.index_select(0, idx)

    def take_range(self, start: int, stop: int):
        """Rows `start:stop` as views, no copy (evaluation reads its splits in order)."""
        return self.x[start:stop], self.y[start:stop]

    def labels(self):
        return self.y

    def hash_into(self, h) -> None:
        for t in (self.x, self.y):
            h.update(str((t.dtype, tuple(t.shape))).encode())
            h.update(t.contiguous().numpy().tobytes())


class MapSource:
    """A user's map-style Dataset whose items are `(x, y)` pairs."""

    def __init__(self, ds: Dataset):
        self.ds = ds
        self._labels: Optional[torch.Tensor] = None

    def __len__(self) -> int:
        return len(self.ds)  # type: ignore[arg-type]

    def take(self, idx):
        if _item_key is None:
            return default_collate([self.ds[i] for i in idx.tolist()])
        return default_collate(_seeded_items(self.ds, idx.tolist(), *_item_key))

    def labels(self):
        if self._labels is None:
            self._labels = torch.as_tensor([int(self.ds[i][1]) for i in range(len(self))])
        return self._labels

    def hash_into(self, h) -> None:
        for i in range(len(self)):
            for t in self.ds[i]:
                h.update(torch.as_tensor(t).contiguous().numpy().tobytes())


def subset(base, indices: torch.Tensor):
    """A view of `base` at `indices`; in-memory arrays are gathered once so `take` is one index op."""
    if isinstance(base, ArraySource):
        return ArraySource(base.x[indices], base.y[indices])
    return Subset(base, indices)


class Subset:
    def __init__(self, base, indices: torch.Tensor):
        self.base, self.indices = base, indices

    def __len__(self) -> int:
        return len(self.indices)

    def take(self, idx):
        return self.base.take(self.indices[idx])

    def labels(self):
        return self.base.labels()[self.indices]

    def hash_into(self, h, hashed: set | None = None) -> None:
        """The base once per bundle (`hashed` holds the ids already hashed), then the indices."""
        if hashed is None or id(self.base) not in hashed:
            self.base.hash_into(h)
            if hashed is not None:
                hashed.add(id(self.base))
        h.update(self.indices.numpy().tobytes())


@dataclass
class DataBundle:
    """The splits of one run plus what the model needs to know about them."""

    train: Source
    val: Optional[Source]
    test: Optional[Source]
    num_classes: Optional[int]  # None for tasks that are not classification
    input_shape: tuple[int, ...]
    content_hash: str = ""
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        for name in ("train", "val", "test"):
            split = getattr(self, name)
            if split is not None and len(split) == 0:
                raise DataError(f"data: the {name} split is empty; use more samples or a smaller split fraction")
        if not self.content_hash:
            h = hashlib.sha256()
            hashed: set = set()  # splits of one user Dataset share it: hash it once, not once per split
            for split in (self.train, self.val, self.test):
                if isinstance(split, Subset):
                    split.hash_into(h, hashed)
                elif split is not None:
                    split.hash_into(h)
            self.content_hash = "sha256:" + h.hexdigest()
