"""`ecotrain review-queue VERSION_OR_RUN DATA`: the examples a human should look at first.

The model (a registry version, `current`, or a run/checkpoint folder) is run on DATA (.npz; labels
optional, normalised like `ecotrain update`'s); the queue holds the most-contradicted examples (highest
confidence on a class other than the label) and the lowest-confidence ones, written as CSV or JSON
(by the --out suffix), atomically.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ecotrain.base import safefile
from ecotrain.continual.gate import predict_proba
from ecotrain.continual.labels import load_label_map, normalise, review_rows
from ecotrain.continual.registry import VERSION_RE
from ecotrain.continual.registry_mlflow import open_registry
from ecotrain.continual.versions import load_version_model
from ecotrain.base.errors import ConfigError, DataError
from ecotrain.export.inference import load_trained
from ecotrain.base.rundir import atomic_write, refuse_overwriting


def _model(target: str, registry: str):
    """(model, input shape, classes) of a version name / `current`, or of a run or checkpoint folder."""
    if not Path(target).exists() and (target == "current" or VERSION_RE.fullmatch(target)):
        reg = open_registry(registry)
        name = reg.resolve(target)
        meta = reg.read_meta(name)
        if meta.get("task") == "language_model":
            raise ConfigError(f"review-queue: {name} is a language model; the queue ranks a classifier's labelled "
                              "examples")
        return load_version_model(reg, name), tuple(meta["input_shape"]), meta["num_classes"]

    t = load_trained(target, "cpu")
    if t.is_lm:
        raise ConfigError(f"review-queue: {target} is a language model; the queue ranks a classifier's labelled "
                          "examples")
    return t.model, tuple(t.bundle.input_shape), t.bundle.num_classes


def review_queue(target: str, data: str, out: str, registry: str, top: int = 50,
                 label_map: Optional[str] = None) -> tuple[int, Path]:
    out_path = Path(out)
    if out_path.suffix not in (".csv", ".json"):
        raise ConfigError(f"--out {out_path}: give a .csv or .json file")
    if not out_path.parent.is_dir():
        raise ConfigError(f"--out {out_path}: the folder {out_path.parent} does not exist")
    refuse_overwriting(out_path, "--out", [data])
    if top <= 0:
        raise ConfigError(f"--top {top}: must be at least 1")
    model, shape, k = _model(target, registry)
    path = Path(data)
    if path.suffix != ".npz" or not path.is_file():
        raise DataError(f"{path}: not found or not an .npz file (x, and optionally y)")
    try:
        with safefile.open_regular(path, ".npz file", error=DataError) as fh, np.load(fh, allow_pickle=False) as z:
            arrays = {key: z[key] for key in z.files if key in ("x", "y")}
    except DataError:
        raise
    except Exception as exc:
        raise DataError(f"{path}: cannot read as .npz ({type(exc).__name__}: {exc})") from None
    if "x" not in arrays or arrays["x"].dtype.kind not in "biuf":
        raise DataError(f"{path}: needs a numeric array 'x'")
    x = torch.from_numpy(np.ascontiguousarray(arrays["x"], dtype=np.float32))
    if tuple(x.shape[1:]) != shape:
        raise DataError(f"{path}: samples of shape {tuple(x.shape[1:])}, the model takes {shape}")
    y = normalise(arrays["y"], load_label_map(label_map), f"{path} 'y'") if "y" in arrays else None
    if y is not None and (len(y) != len(x) or (len(y) and int(y.max()) >= k)):
        raise DataError(f"{path}: 'y' must hold one class id (0 to {k - 1}) per row of 'x'")
    rows = review_rows(predict_proba(model, x), y, top)
    if out_path.suffix == ".json":
        data_out = json.dumps({"model": target, "data": str(path), "rows": rows}, indent=2) + "\n"
    else:
        buf = io.StringIO()
        keys = ["index", "reason", "predicted", "confidence", *(["label", "label_probability"] if y is not None else [])]
        w = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
        data_out = buf.getvalue()
    atomic_write(out_path, data_out.encode())
    return len(rows), out_path
