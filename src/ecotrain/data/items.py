"""A recipe's `pkg.module:Dataset` whose items are not `(x, class id)` pairs: dicts (`input_ids`,
`labels`, `attention_mask`), per-token targets, several inputs: any structure the Python API takes.

Item 0 decides the kind (data/builtin.py): a pair whose second element is one number keeps the
classification path (every label read, stratified split). Anything else comes here: a fixed sample
of 16 items is read (never the whole dataset), each must have item 0's structure, dtypes and
shapes (a batch is `default_collate` of items), hold finite floats, and an integer target must be
ids >= 0 or IGNORE (-100), below the dataset's `num_classes`/`vocab_size` when it has one. The
splits are seeded and random, by item (no labels to stratify by).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Iterator, Optional

import torch
from torch.utils.data import default_collate

from ecotrain.core.batch import describe as describe_batch
from ecotrain.core.batch import leaves
from ecotrain.data.sources import DataBundle, MapSource, sample_positions, subset
from ecotrain.data.text import IGNORE
from ecotrain.base.errors import DataError
from ecotrain.core.task import TARGET_KEYS


def item_shapes(item) -> str:
    """An item's structure, dtypes and shapes (collated alone: arrays and numbers become tensors)."""
    return describe_batch(default_collate([item])).replace("[1, ", "[").replace("[1]", "[]")


def is_class_pair(item) -> bool:
    """`(x, y)` with y one number: the classification path."""
    if not isinstance(item, (tuple, list)) or len(item) != 2:
        return False
    try:
        return torch.as_tensor(item[1]).numel() == 1
    except Exception:  # noqa: BLE001 - y not numeric: not a class pair; the checks below say what it is
        return False


def is_structured(item) -> bool:
    return isinstance(item, Mapping) or (isinstance(item, (tuple, list)) and len(item) >= 2)


def _named(value, name: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(value, torch.Tensor):
        yield name or "the item", value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from _named(v, f"{name}.{k}" if name else f"'{k}'")
    elif isinstance(value, (tuple, list)):
        for j, v in enumerate(value):
            yield from _named(v, f"{name}[{j}]" if name else f"element {j}")


def _target(item) -> Optional[str]:
    """The name (as `_named` gives it) of the item's target: a dict's 'labels'/... key, a tuple's last element."""
    if isinstance(item, Mapping):
        key = next((k for k in TARGET_KEYS if k in item), None)
        return None if key is None else f"'{key}'"
    return f"element {len(item) - 1}"


def check_items(ds, n: int, where: str, vocab: Optional[int]) -> None:
    first = None
    for i in sample_positions(n):
        try:
            item = ds[i]
        except Exception as exc:  # the user's __getitem__, whatever it raises
            said = " ".join(str(exc).split())[:300]  # one line, whatever the user's message spans
            raise DataError(f"{where}: item {i} raised {type(exc).__name__}: {said}") from None
        if not is_structured(item):
            raise DataError(f"{where}: item {i} is {type(item).__name__} where item 0 is {type(ds[0]).__name__}; "
                            "every item must have one structure")
        try:
            collated = default_collate([item])
            shapes = item_shapes(item)
        except Exception as exc:  # numbers of mixed types, objects collate cannot stack
            raise DataError(f"{where}: item {i} cannot be made a batch ({type(exc).__name__}: {exc}); "
                            "items must hold tensors, arrays or numbers") from None
        if first is None:
            first = shapes
            if not leaves(collated):
                raise DataError(f"{where}: item 0 holds no tensor ({describe_batch(collated)}); items must hold "
                                "tensors or arrays")
        elif shapes != first:
            raise DataError(f"{where}: item {i} holds {shapes} where item 0 holds {first}; every item must have "
                            "the same structure and shapes (pad sequences to one length in the Dataset)")
        target = _target(item)
        for name, t in _named(collated):
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                raise DataError(f"{where}: item {i}: {name} holds NaN/Inf; clean or impute it")
            if name == target and not t.is_floating_point() and t.dtype != torch.bool and t.numel():
                _check_ids(t[0], f"{where}: item {i}: {name}", vocab)


def _check_ids(y: torch.Tensor, where: str, vocab: Optional[int]) -> None:
    y = y.reshape(-1)
    bad = ((y < 0) & (y != IGNORE)) | (y >= vocab if vocab else torch.zeros_like(y, dtype=torch.bool))
    if bool(bad.any()):
        at = int(bad.nonzero()[0, 0])
        allowed = f"0 to {vocab - 1}" if vocab else "0 or more"
        raise DataError(f"{where} holds {int(y[at])} at position {at}; targets must be ids {allowed}, or {IGNORE} "
                        "where no loss is taken")


def structured_bundle(cfg, ds, n: int, where: str) -> DataBundle:
    """The checked Dataset in seeded random splits: test, then validation, then train."""
    vocab = next((v for v in (getattr(ds, "num_classes", None), getattr(ds, "vocab_size", None))
                  if isinstance(v, int) and not isinstance(v, bool)), None)
    if vocab is not None and vocab < 1:
        raise DataError(f"{where}: num_classes/vocab_size must be a positive int, got {vocab!r}")
    check_items(ds, n, where, vocab)
    base = MapSource(ds)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(cfg.seed))
    n_test, n_val = round(n * cfg.data.test_split), round(n * cfg.data.val_split)
    if n - n_test - n_val < 1 or (cfg.data.val_split > 0 and n_val == 0):
        raise DataError(f"{where}: {n} items are too few for data.val_split={cfg.data.val_split} and "
                        f"data.test_split={cfg.data.test_split}; give more items or smaller splits")
    test = subset(base, perm[:n_test].sort().values) if n_test else None
    val = subset(base, perm[n_test:n_test + n_val].sort().values) if n_val else None
    train = subset(base, perm[n_test + n_val:].sort().values)
    sample = train.take(torch.tensor([0]))
    shape = tuple(leaves(sample)[0].shape[1:])
    return DataBundle(train, val, test, vocab, shape, sample=sample)
