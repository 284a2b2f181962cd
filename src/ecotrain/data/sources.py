"""What the loop reads from: a `Source` returns a whole batch for a tensor of indices.

In-memory arrays take the fast path (`x[idx]`, no per-sample Python: an `(x, y)` tuple); any
map-style `torch.utils.data.Dataset`, its items of any structure (tuples, dicts, nested), works
through `MapSource` with `default_collate`; a user's `DataLoader` (or one built around an
`IterableDataset`) through `LoaderSource`, read in its own order. Nothing reads a user Dataset
whole: labels come from its `labels`/`targets` attribute when a feature needs them, and its
fingerprint from its length and a fixed sample of items (`data.fingerprint` overrides). The loader
fetches a training batch through `seeded(source, seed, epoch)`: each item of a user Dataset is read
with the global generators seeded by (seed, epoch, sample index), so random augmentation in
`__getitem__` is the same in the training process and in any loader worker, whichever worker reads
the item. Evaluation reads a split in order with `core.batch.iter_batches`.
"""

from __future__ import annotations

import copy
import hashlib
import random
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol

import numpy as np
import torch
from torch.utils.data import Dataset, default_collate
from torch.utils.data import sampler as torch_samplers

from ecotrain.core.batch import batch_size as batch_size_of
from ecotrain.base.errors import DataError
from ecotrain.base.log import log
from ecotrain.core.task import TARGET_KEYS

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
    def take(self, idx: torch.Tensor) -> Any: ...  # a batch: (x, y) for arrays, any structure for a Dataset
    def labels(self) -> torch.Tensor: ...
    def hash_into(self, h) -> None: ...  # the content fingerprint (unless data.fingerprint names it)


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


FINGERPRINT_ITEMS = 16  # items of a user Dataset read for its fingerprint (never the whole dataset)


def sample_positions(n: int, k: int = FINGERPRINT_ITEMS) -> list[int]:
    """`k` fixed positions spread over `n` items (the first and the last included)."""
    if n <= k:
        return list(range(n))
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def hash_value(h, value) -> None:
    """Feed one item or batch of any structure into hash `h`: tensors by bytes, the rest by repr."""
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        h.update(str((t.dtype, tuple(t.shape))).encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(value, np.ndarray):
        hash_value(h, torch.from_numpy(np.ascontiguousarray(value)))
    elif isinstance(value, dict):
        for k in sorted(value, key=str):
            h.update(repr(k).encode())
            hash_value(h, value[k])
    elif isinstance(value, (tuple, list)):
        h.update(b"(")
        for v in value:
            hash_value(h, v)
        h.update(b")")
    else:
        h.update(repr(value).encode())


def attribute_labels(ds) -> Optional[torch.Tensor]:
    """A dataset's labels without reading its items: a `labels` or `targets` attribute (torchvision's
    name), an array or a list of class ids; None when it has neither."""
    for name in ("labels", "targets"):
        lab = getattr(ds, name, None)
        if lab is None or callable(lab):
            continue
        try:
            return torch.as_tensor(np.asarray(lab)).reshape(-1)
        except (TypeError, ValueError):
            continue
    return None


class MapSource:
    """A user's map-style Dataset; its items may be of any structure (collated by `default_collate`)."""

    def __init__(self, ds: Dataset):
        self.ds = ds
        self._labels: Optional[torch.Tensor] = None

    def __len__(self) -> int:
        return len(self.ds)  # type: ignore[arg-type]

    def take(self, idx):
        return default_collate([self.ds[i] for i in idx.tolist()])

    def has_labels(self) -> bool:
        """Labels are cheap: an attribute of the dataset, no item read."""
        return self._labels is not None or attribute_labels(self.ds) is not None

    def labels(self):
        """Class ids: the dataset's `labels`/`targets` attribute, else read from every item once, when
        a feature asks for them (an item's second element, or its 'labels'/'label'/... entry)."""
        if self._labels is None:
            lab = attribute_labels(self.ds)
            if lab is None:
                log.info(f"data: reading the labels of all {len(self)} items (give the Dataset a `labels` "
                         "attribute to skip this)")
                lab = torch.as_tensor([int(_item_target(self.ds[i])) for i in range(len(self))])
            if len(lab) != len(self):
                raise DataError(f"data: the Dataset's labels attribute holds {len(lab)} labels for {len(self)} items")
            self._labels = lab
        return self._labels

    def hash_into(self, h) -> None:
        n = len(self)
        h.update(f"map:{type(self.ds).__qualname__}:{n}".encode())
        for item in _seeded_items(self.ds, sample_positions(n), 0, 0):  # seeded: random augmentation hashes alike
            hash_value(h, item)


def _item_target(item):
    if isinstance(item, dict):
        for k in TARGET_KEYS:
            if k in item:
                return item[k]
    if isinstance(item, (tuple, list)) and len(item) >= 2:
        return item[1]
    raise DataError(f"data: cannot find the label of an item of type {type(item).__name__}; give the Dataset "
                    "a `labels` attribute")


class LoaderSource:
    """A user's `DataLoader` (torchdata's `StatefulDataLoader` included), or one built around an
    `IterableDataset`: its batches are read in its own order, one pass per epoch. Resume is exact
    when the loader has `state_dict`/`load_state_dict` (the checkpoint holds it); otherwise the
    epoch is re-read from its start with every generator the loader draws from set back to its
    state at that epoch's start, and the trained batches skipped (data/loader.py says so once).

    The generators: torch's global one, swapped for the loader's own while it is read (`read`), and
    any `torch.Generator` the user gave the loader or its sampler (`shuffle=True, generator=g`,
    `RandomSampler(generator=g)`, `WeightedRandomSampler`, a `BatchSampler` around one)."""

    def __init__(self, loader, fingerprint: Optional[str] = None):
        self.loader, self.fingerprint = loader, fingerprint
        self.stateful = all(callable(getattr(loader, a, None)) for a in ("state_dict", "load_state_dict"))
        self.resumed_by_state = False  # a restored state: the next pass starts where the saved one stopped
        self.rank_sharded = False  # a `datasets` stream split per rank by ecotrain (assemble._rank_share)
        self.rng = torch.Generator().manual_seed(0).get_state()  # the loader's own torch RNG (`seed`)
        self.limit: Optional[int] = None  # samples an evaluation reads at most (`head`)
        self.user_generators = loader_generators(loader)
        self.epoch_start = self._states()  # every generator as it was when the current pass began

    def seed(self, seed: int) -> None:
        self.rng = torch.Generator().manual_seed(seed + 7919).get_state()
        self.epoch_start = self._states()

    def _states(self) -> list:
        return [self.rng.clone()] + [g.get_state() for g in self.user_generators]

    def _set_states(self, states: list) -> None:
        self.rng = states[0].clone()
        for g, s in zip(self.user_generators, states[1:]):
            g.set_state(s)

    def begin_pass(self, start: int, epoch: int = 0):
        """`(iterator, by_state)` for an epoch read from batch `start`; by_state: the loader resumes
        by its own state. A fresh pass (start 0) records every generator's state first; a pass
        re-read from its start to skip `start` trained batches first rewinds them to that record,
        so the re-read draws the interrupted epoch's order (not the next epoch's). A loader
        resuming by its state draws its order from that state: what its `iter()` takes from the
        global generator is given back, so the stream stays the uninterrupted run's."""
        for obj in (*samplers_of(self.loader), getattr(self.loader, "dataset", None)):
            if callable(getattr(obj, "set_epoch", None)):  # as its user must: a DistributedSampler's order, a
                obj.set_epoch(epoch)  # `datasets` stream's shuffle and its resume (it resumes in the saved epoch)
        if start and self.resumed_by_state:
            rng = self.rng.clone()
            it = self.read(iter, self.loader)
            self.rng = rng
            return it, True
        if start:
            self._set_states(self.epoch_start)
        else:
            self.epoch_start = self._states()
        return self.read(iter, self.loader), False

    def in_order(self, batch_size: int):
        """The loader's own batches, in its order, up to `limit` samples (evaluation: core.batch.iter_batches)."""
        it, seen = self.read(iter, self.loader), 0
        while (self.limit is None or seen < self.limit) and (batch := self.read(next, it, None)) is not None:
            seen += batch_size_of(batch)
            yield batch

    def read(self, fn, *args):
        """`fn(*args)` (iter or next on the loader) with torch's global generator swapped for the
        loader's own: a DataLoader draws its shuffle and worker seeds from the global generator, which
        would shift the model's dropout masks by a resume's extra `iter()`; the swap keeps training's
        random stream the same whether or not the run was resumed."""
        train = torch.get_rng_state()
        torch.set_rng_state(self.rng)
        try:
            return fn(*args)
        finally:
            self.rng = torch.get_rng_state()
            torch.set_rng_state(train)

    def state_dict(self) -> dict:
        return {"loader": self.loader.state_dict() if self.stateful else None, "rng": self.rng.clone(),
                "generators": [g.get_state() for g in self.user_generators],
                "epoch_start": [s.clone() for s in self.epoch_start]}

    def load_state_dict(self, sd: Optional[dict]) -> None:
        if not sd:
            return
        now = [sd["rng"]] + list(sd.get("generators") or [])
        if len(now) == 1 + len(self.user_generators):  # else another loader: its generators start afresh
            self._set_states(now)
        else:
            self.rng = sd["rng"].clone()
        # a checkpoint from before the record: the pass's start is unknown, the current state stands in
        self.epoch_start = [s.clone() for s in sd.get("epoch_start") or self._states()]
        if sd.get("loader") is not None and self.stateful:
            self.loader.load_state_dict(sd["loader"])
            self.resumed_by_state = True

    def head(self, n: int) -> "LoaderSource":
        """The loader's first `n` samples (at least), for evaluation: an endless stream ends there."""
        part = copy.copy(self)
        part.limit = n
        return part

    def batches_per_epoch(self) -> Optional[int]:
        try:
            return len(self.loader)
        except TypeError:  # an IterableDataset without __len__
            return None

    def __len__(self) -> int:
        """Samples per pass when known (else 0): only figures (the ledger's evaluation count) read it."""
        try:
            return len(self.loader.dataset)
        except TypeError:
            return 0

    def first_batch(self):
        """One batch for set-up (the task's shape): collated from item 0 of a map-style dataset, else
        the stream's first batch (a fresh iterator, dropped: the loop starts its own)."""
        ds = getattr(self.loader, "dataset", None)
        if ds is not None and not isinstance(ds, torch.utils.data.IterableDataset):
            collate = getattr(self.loader, "collate_fn", None) or default_collate
            return collate([ds[0]])
        it = self.read(iter, self.loader)
        try:
            return self.read(next, it)
        except StopIteration:
            raise DataError("data: the DataLoader yielded no batch; check the dataset is not empty") from None
        finally:
            del it

    def hash_into(self, h) -> None:
        ds = getattr(self.loader, "dataset", None)
        h.update(f"loader:{type(self.loader).__qualname__}:{type(ds).__qualname__}".encode())
        if ds is not None and not isinstance(ds, torch.utils.data.IterableDataset):
            MapSource(ds).hash_into(h)  # a map-style dataset: its length and sampled items


def loader_generators(loader) -> list:
    """The distinct `torch.Generator`s a DataLoader's order draws from, besides the global one."""
    found: list = []
    batch_sampler = getattr(loader, "batch_sampler", None)
    for obj in (loader, getattr(loader, "sampler", None), batch_sampler, getattr(batch_sampler, "sampler", None)):
        g = getattr(obj, "generator", None)
        if isinstance(g, torch.Generator) and not any(g is h for h in found):
            found.append(g)
    return found


def samplers_of(loader) -> list:
    """The loader's sampler objects: its sampler, its batch sampler and the batch sampler's sampler."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    found = (getattr(loader, "sampler", None), batch_sampler, getattr(batch_sampler, "sampler", None))
    return [s for s in found if s is not None]


def distributed_sampler(loader):
    """The loader's `DistributedSampler` (torch's, or any sampler with num_replicas, rank and set_epoch), or None."""
    return next((s for s in samplers_of(loader) if all(hasattr(s, a) for a in ("num_replicas", "rank", "set_epoch"))),
                None)


def replay_warning(loader) -> Optional[str]:
    """Why a stateless loader's re-read of an interrupted epoch may not replay its order, or None:
    a sampler that is not one of torch's (their order comes from the generators `LoaderSource` keeps)."""
    if isinstance(getattr(loader, "dataset", None), torch.utils.data.IterableDataset):
        return None
    ts = torch_samplers
    known = (ts.SequentialSampler, ts.RandomSampler, ts.SubsetRandomSampler, ts.WeightedRandomSampler,
             ts.BatchSampler, torch.utils.data.DistributedSampler)
    for obj in samplers_of(loader):
        if not isinstance(obj, known):
            return (f"data: the DataLoader's sampler {type(obj).__qualname__} is not one of torch's and has no "
                    "state_dict, so a resume re-reads the interrupted epoch through it and is exact only if its "
                    "order depends on nothing but the epoch; give it state_dict/load_state_dict or use "
                    "torchdata's StatefulDataLoader")
    return None


class _SeededItems:
    """A user Dataset's training reads: each item with its own seed (`seeded`)."""

    def __init__(self, source: "MapSource", seed: int, epoch: int):
        self.source, self.seed, self.epoch = source, seed, epoch

    def __len__(self) -> int:
        return len(self.source)

    def take(self, idx):
        return default_collate(_seeded_items(self.source.ds, idx.tolist(), self.seed, self.epoch))


def seeded(source, seed: int, epoch: int):
    """`source` as the loader reads it for training in `epoch`: a user Dataset's items (a MapSource,
    or a Subset of one) each read with the generators seeded by (seed, epoch, index); any other source
    as it is (in-memory arrays and files have no per-item randomness). Passed in, not set aside in a
    global: a worker and the training process read alike because they are handed the same view."""
    if isinstance(source, MapSource):
        return _SeededItems(source, seed, epoch)
    if isinstance(source, Subset):
        return Subset(seeded(source.base, seed, epoch), source.indices)
    return source


def subset(base, indices: torch.Tensor):
    """A view of `base` at `indices`; in-memory arrays are gathered once so `take` is one index op."""
    if isinstance(base, ArraySource):
        return ArraySource(base.x[indices], base.y[indices])
    return Subset(base, indices)


def dropped(source) -> int:
    """Samples the last `take` in this process left out as damaged (`data.on_bad_shard: skip`)."""
    while isinstance(source, Subset):
        source = source.base
    return len(getattr(source, "last_dropped", ()))


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
    sample: Any = None  # one training batch of one item (the task's shape); None: built-in arrays

    def __post_init__(self):
        for name in ("train", "val", "test"):
            split = getattr(self, name)
            if split is not None and not isinstance(split, LoaderSource) and len(split) == 0:
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
