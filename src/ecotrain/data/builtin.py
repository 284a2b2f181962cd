"""Built-in and user data sources, validated before anything trains.

mnist1d: generated offline with the `mnist1d` package's `make_dataset` (never its download path).
text: the Python standard library's source as byte sequences, for language models (data/text.py).
digits: scikit-learn's 8x8 digits, shipped inside the package.
npz / csv: the user's files. `pkg.module:Name`: a map-style Dataset (or a factory returning one).
"""

from __future__ import annotations

import csv
import importlib
from pathlib import Path

import numpy as np
import torch

from ecotrain.config import Config
from ecotrain.data.sources import ArraySource, DataBundle, MapSource, subset
from ecotrain.data.split import stratified_split
from ecotrain.errors import DataError


def validate_arrays(x, y, where: str, num_classes: int | None = None) -> None:
    """One clear error for data that would otherwise fail (or silently mislead) mid-training."""
    if len(x) != len(y):
        raise DataError(f"{where}: {len(x)} feature rows but {len(y)} labels; they must match")
    if len(y) == 0:
        raise DataError(f"{where}: no samples")
    if torch.is_floating_point(x):
        bad = ~torch.isfinite(x)
        if bad.any():
            row = int(bad.reshape(len(x), -1).any(1).nonzero()[0])
            raise DataError(f"{where}: features hold NaN/Inf (first at row {row}); clean or impute them")
    if torch.is_floating_point(y):
        if not torch.equal(y, y.round()):
            raise DataError(f"{where}: labels must be integer class ids, got fractional values")
        y = y.long()
    if y.min() < 0 or (num_classes is not None and y.max() >= num_classes):
        hi = f"< {num_classes}" if num_classes is not None else ">= 0"
        bad_row = int(((y < 0) | (y >= (num_classes or 1 << 62))).nonzero()[0])
        raise DataError(f"{where}: label {int(y[bad_row])} at row {bad_row} is out of range (labels must be >= 0 and {hi})")


def _tensors(x, y, where: str, num_classes=None):
    x = torch.as_tensor(np.asarray(x, dtype=np.float32))
    y_arr = np.asarray(y)
    y = torch.as_tensor(y_arr.astype(np.float64) if y_arr.dtype.kind == "f" else y_arr)
    validate_arrays(x, y, where, num_classes)
    return x, y.long()


def _mnist1d(cfg: Config):
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples = cfg.data.num_samples
    for k, v in cfg.data.kwargs.items():
        if not hasattr(args, k):
            raise DataError(f"data.kwargs.{k}: not an mnist1d dataset argument")
        setattr(args, k, v)
    d = make_dataset(args)  # generated here; get_dataset() would try a download
    train = _tensors(d["x"], d["y"], "mnist1d train", 10)
    test = _tensors(d["x_test"], d["y_test"], "mnist1d test", 10)
    return train, test, 10


def _digits(cfg: Config):
    from sklearn.datasets import load_digits

    d = load_digits()
    return _tensors(d.data / 16.0, d.target, "digits", 10), None, 10


def _npz(cfg: Config):
    path = _need_path(cfg)
    try:
        z = np.load(path, allow_pickle=False)  # never unpickle user files
    except Exception as exc:
        raise DataError(f"{path}: cannot read as .npz ({exc})") from None
    for key in ("x", "y"):
        if key not in z.files:
            raise DataError(f"{path}: missing array '{key}' (found {z.files}); save with np.savez(path, x=..., y=...)")
    train = _tensors(z["x"], z["y"], f"{path} x/y")
    test = _tensors(z["x_test"], z["y_test"], f"{path} x_test/y_test") if "x_test" in z.files else None
    return train, test, None


def _csv(cfg: Config):
    path = _need_path(cfg)
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if len(rows) < 2:
        raise DataError(f"{path}: needs a header row and at least one data row")
    header, body = rows[0], rows[1:]
    if cfg.data.target not in header:
        raise DataError(f"{path}: no column '{cfg.data.target}' (columns: {header}); set data.target")
    t = header.index(cfg.data.target)
    feats, labels = [], []
    for i, r in enumerate(body, start=2):
        if len(r) != len(header):
            raise DataError(f"{path}:{i}: {len(r)} fields, header has {len(header)}")
        try:
            feats.append([float(v) for j, v in enumerate(r) if j != t])
            labels.append(float(r[t]))
        except ValueError as exc:
            raise DataError(f"{path}:{i}: not a number ({exc})") from None
    return _tensors(feats, labels, str(path)), None, None


def _need_path(cfg: Config) -> Path:
    if not cfg.data.path:
        raise DataError(f"data.path: required for data.name={cfg.data.name}")
    p = Path(cfg.data.path)
    if not p.is_file():
        raise DataError(f"data.path: {p} not found")
    return p


def import_object(path: str, what: str):
    mod_name, sep, attr = path.partition(":")
    if not sep:
        raise DataError(f"{what}: '{path}' is not a built-in name nor an import path 'pkg.module:Name'")
    try:
        return getattr(importlib.import_module(mod_name), attr)
    except (ImportError, AttributeError) as exc:
        raise DataError(f"{what}: cannot import '{path}' ({exc})") from None


BUILTIN = {"mnist1d": _mnist1d, "digits": _digits, "npz": _npz, "csv": _csv}


def load_data(cfg: Config) -> DataBundle:
    """Load the configured source, hold out test (if it has none) and validation, seeded."""
    name = cfg.data.name
    if name == "text":  # token sequences: split by sequence, not stratified by class (data/text.py)
        from ecotrain.data.text import load_text

        return load_text(cfg)
    if name in BUILTIN:
        (x, y), test, num_classes = BUILTIN[name](cfg)
        base = ArraySource(x, y)
        num_classes = num_classes or int(y.max()) + 1
        test_src = ArraySource(*test) if test is not None else None
    else:
        obj = import_object(name, "data.name")
        ds = obj(**cfg.data.kwargs) if callable(obj) else obj
        base, test_src = MapSource(ds), None
        num_classes = getattr(ds, "num_classes", None) or int(base.labels().max()) + 1
        if len(base) == 0:
            raise DataError(f"data.name: dataset '{name}' is empty")
        x0, y0 = ds[0]
        validate_arrays(torch.as_tensor(x0)[None], torch.as_tensor([y0]), f"{name} item 0", num_classes)
    labels = base.labels()
    if test_src is None and cfg.data.test_split > 0:
        keep, held = stratified_split(labels, cfg.data.test_split, cfg.seed + 1, cfg.data.stratify)
        base, test_src = subset(base, keep), subset(base, held)
        labels = labels[keep]
    keep, held = stratified_split(labels, cfg.data.val_split, cfg.seed, cfg.data.stratify)
    if cfg.data.val_split > 0 and len(held) == 0:
        raise DataError(f"data.val_split: {cfg.data.val_split} of {len(labels)} samples leaves the validation split empty; "
                        "use more data, a larger split, or data.val_split=0")
    val = subset(base, held) if len(held) else None
    train = subset(base, keep)
    x0, _ = train.take(torch.tensor([0]))
    return DataBundle(train, val, test_src, num_classes, tuple(x0.shape[1:]))
