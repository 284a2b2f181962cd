"""Arrow columns to training tensors, and the content fingerprint of big on-disk datasets; shared
by `hf:PATH` (data/hf.py) and `parquet:PATH` (data/shards.py). pyarrow is imported by them only."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import torch

from ecotrain.base import safefile
from ecotrain.base.errors import DataError

SAMPLE_BYTES = 64 * 1024  # a big file's fingerprint reads this much of its head and of its tail


def need(module: str, what: str):
    """Import an optional package, or one line saying how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise DataError(f"{what}: needs the '{module.split('.')[0]}' package; pip install 'ecotrain[data]'") from None


def feature_columns(schema_names: list[str], features, target: str, where: str) -> list[str]:
    """The feature columns (data.features, or every column but the target), each checked present."""
    if target not in schema_names:
        raise DataError(f"{where}: no label column '{target}' (columns: {schema_names}); set data.target")
    cols = list(features) if features else [c for c in schema_names if c != target]
    missing = [c for c in cols if c not in schema_names]
    if missing:
        raise DataError(f"{where}: no feature column '{missing[0]}' (columns: {schema_names}); fix data.features")
    if not cols:
        raise DataError(f"{where}: only the label column '{target}'; at least one feature column is needed")
    return cols


def _to_numpy(arr, name: str, where: str) -> np.ndarray:
    """An Arrow array of numbers or of (nested) equal-length lists of numbers -> (rows, ...)."""
    import pyarrow as pa

    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if isinstance(arr.type, pa.ExtensionType):  # datasets' Array2D/3D...: nested lists underneath
        arr = arr.storage
    if arr.null_count:
        raise DataError(f"{where}: column '{name}' holds nulls; fill or drop those rows")
    rows, shape = len(arr), []
    while pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type) or pa.types.is_fixed_size_list(arr.type):
        if pa.types.is_fixed_size_list(arr.type):
            width = arr.type.list_size
        else:
            lengths = np.diff(np.asarray(arr.offsets))
            width = int(lengths[0]) if len(lengths) else 0
            if len(lengths) and not (lengths == width).all():
                bad = int(np.flatnonzero(lengths != width)[0])
                raise DataError(f"{where}: column '{name}' has lists of different lengths ({width} at its first "
                                f"row, {int(lengths[bad])} at row {bad}); every sample must have the same shape")
        shape.append(width)
        arr = arr.flatten()  # offsets respected: a sliced list array flattens to its own values
    if not (pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type) or pa.types.is_boolean(arr.type)):
        raise DataError(f"{where}: column '{name}' is {arr.type}, not numbers; convert or encode it first")
    return arr.to_numpy(zero_copy_only=False).reshape(rows, *shape)


def table_xy(table, cols: list[str], target: str, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(x float32 of shape (rows, ...), y int64) from an Arrow table's columns."""
    parts = [_to_numpy(table.column(c), c, where) for c in cols]
    if len(parts) == 1:
        x = parts[0]
    else:  # several columns: each one number per sample, side by side
        wide = [c for c, p in zip(cols, parts) if p.ndim != 1]
        if wide:
            raise DataError(f"{where}: column '{wide[0]}' holds lists; with several feature columns each must be "
                            "one number per sample (or name one list column in data.features)")
        x = np.stack(parts, axis=1)
    x = torch.from_numpy(np.array(x, dtype=np.float32))  # a copy: Arrow buffers are read-only
    if not bool(torch.isfinite(x).all()):
        raise DataError(f"{where}: features hold NaN/Inf; clean or impute them")
    return x, labels_of(table.column(target), target, where)


def labels_of(col, target: str, where: str) -> torch.Tensor:
    y = _to_numpy(col, target, where)
    if y.ndim != 1:
        raise DataError(f"{where}: label column '{target}' holds lists; it must be one class id per sample")
    if y.dtype.kind == "f":
        if not np.array_equal(y, np.round(y)):
            raise DataError(f"{where}: labels in '{target}' must be integer class ids, got fractional values")
    return torch.from_numpy(y.astype(np.int64))


def fingerprint(root: Path, files: list[Path], extra: bytes = b"") -> str:
    """The manifest (relative names, sizes), the small JSON metadata whole, and 64 KiB of each big
    file's head and tail: never every byte of a 100 GB dataset (docs/data.md says what it misses)."""
    h = hashlib.sha256(extra)
    for f in files:
        size = f.stat().st_size
        h.update(f"{f.relative_to(root)}\0{size}\0".encode())
        with safefile.open_regular(f, "data file", error=DataError) as fh:
            if f.suffix == ".json" and size <= 1 << 20:
                h.update(fh.read())
            else:
                h.update(fh.read(SAMPLE_BYTES))
                if size > SAMPLE_BYTES:
                    fh.seek(max(SAMPLE_BYTES, size - SAMPLE_BYTES))
                    h.update(fh.read())
    return h.hexdigest()
