"""New data for a registered model: an .npz read without unpickling, its inputs, labels and cohorts
checked against the base model, and the recent slice held out of it (used by `update` and `serve`)."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ecotrain.base import safefile
from ecotrain.continual.labels import normalise
from ecotrain.data.split import stratified_split
from ecotrain.base.errors import DataError

RECENT_FRACTION = 0.2


def load_npz(path: Path, what: str) -> dict:
    """Every array of an .npz file, read without unpickling; one line for anything else."""
    if path.suffix != ".npz" or not path.is_file():
        raise DataError(f"{path}: not found or not an .npz file; {what}")
    with safefile.open_regular(path, ".npz file", error=DataError) as fh:  # is_file above; swapped since: one line
        return _arrays(fh, path)


def _arrays(fh, path: Path) -> dict:
    if not zipfile.is_zipfile(fh):
        raise DataError(f"{path}: not an .npz archive; save it with np.savez(path, x=..., y=...)")
    fh.seek(0)
    try:
        with np.load(fh, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except ValueError as exc:
        if "allow_pickle" in str(exc):
            raise DataError(f"{path}: holds Python objects (dtype=object), which ecotrain never unpickles; "
                            "save numeric or string arrays") from None
        raise DataError(f"{path}: cannot read as .npz ({exc})") from None
    except Exception as exc:
        raise DataError(f"{path}: cannot read as .npz ({type(exc).__name__}: {exc})") from None


def checked_x(arrays: dict, key: str, input_shape: tuple, path: Path) -> torch.Tensor:
    """An .npz's inputs: numbers, the model's sample shape, finite; float32."""
    x = arrays[key]
    if x.dtype.kind not in "biuf":
        raise DataError(f"{path}: '{key}' must be numbers, got dtype {x.dtype}")
    x = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    if tuple(x.shape[1:]) != tuple(input_shape):
        raise DataError(f"{path}: '{key}' has samples of shape {tuple(x.shape[1:])}, the base model takes "
                        f"{tuple(input_shape)}")
    if not bool(torch.isfinite(x).all()):
        raise DataError(f"{path}: '{key}' holds NaN/Inf; clean or impute it")
    return x


def checked_labels(arrays: dict, key: str, rows: int, label_map: Optional[dict], num_classes: int, path: Path,
                   xk: str = "x") -> torch.Tensor:
    """An .npz's labels (normalised: labels.py): one per row, each a class of the model."""
    y = normalise(arrays[key], label_map, f"{path} '{key}'")
    if len(y) != rows:
        raise DataError(f"{path}: '{xk}' has {rows} rows but '{key}' {len(y)}")
    if len(y) and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        raise DataError(f"{path}: '{key}' holds class {int(y.max()) if int(y.min()) >= 0 else int(y.min())}; "
                        f"the base model has {num_classes} classes (0 to {num_classes - 1})")
    return y


def checked_cohort(arrays: dict, key: str, rows: int, path: Path, xk: str = "x") -> Optional[torch.Tensor]:
    """An .npz's optional cohort column: one integer key per row, or None."""
    c = arrays.get(key)
    if c is None:
        return None
    if c.dtype.kind not in "iu" or c.shape != (rows,):
        raise DataError(f"{path}: '{key}' must be one integer cohort key per row of '{xk}'")
    return torch.from_numpy(c.astype(np.int64))


def read_incoming(path: Path, label_map: Optional[dict], input_shape: tuple, num_classes: int):
    """(x, y, cohort, test) with test = (x_test, y_test, cohort_test) or None; every check one line."""
    arrays = load_npz(path, "NEW_DATA is an .npz with x and y (and optionally x_test, y_test, cohort)")
    for key in ("x", "y"):
        if key not in arrays:
            raise DataError(f"{path}: missing array '{key}' (found {sorted(arrays)})")

    def part(xk, yk, ck):
        x = checked_x(arrays, xk, input_shape, path)
        return x, checked_labels(arrays, yk, len(x), label_map, num_classes, path, xk), \
            checked_cohort(arrays, ck, len(x), path, xk)

    x, y, c = part("x", "y", "cohort")
    if len(x) == 0:
        raise DataError(f"{path}: no samples in 'x'")
    test = part("x_test", "y_test", "cohort_test") if "x_test" in arrays and "y_test" in arrays else None
    return x, y, c, test


def recent_split(x, y, c, test, seed: int):
    """(train x, y, cohort) and the recent slice's (x, y, cohort)."""
    if test is not None:
        return (x, y, c), test
    keep, held = stratified_split(y, RECENT_FRACTION, seed)
    if len(held) == 0 or len(keep) == 0:
        raise DataError(f"the incoming data has too few samples ({len(y)}) to hold out a recent slice; "
                        "add x_test/y_test or send more data")
    pick = (lambda t, i: t[i] if t is not None else None)
    return (x[keep], y[keep], pick(c, keep)), (x[held], y[held], pick(c, held))
