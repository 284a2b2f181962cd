"""`ecotrain predict MODEL.pt2|MODEL.onnx --data FILE --out CSV`: predictions from an exported file alone.

No run folder, no config, no model class: the program is the file (torch.export.load, or an
onnxruntime session), and what ecotrain needs besides it (the task, the input's dtype and shape, a CSV
run's column names) is the `ecotrain.json` written inside it. The data is one .npz (`x`, optional `y`)
or .csv (the model's columns by name; the target column, when there, is the label). The CSV written
is `ecotrain predict`'s: index, prediction, label (when given), prob_0 ... prob_{K-1}.
"""

from __future__ import annotations

import csv
import io
import zipfile
from pathlib import Path

import numpy as np
import torch

from ecotrain.data.builtin import csv_features, csv_numbers, read_csv
from ecotrain.errors import ConfigError, DataError
from ecotrain.export import onnxfile
from ecotrain.export.program import load_pt2
from ecotrain.rundir import atomic_write, refuse_overwriting
from ecotrain.userpath import user_path

SUFFIXES = (".pt2", ".onnx")
BATCH = 1024  # rows per call


def is_exported(target: str) -> bool:
    return Path(target).suffix.lower() in SUFFIXES


def load_exported(path: Path):
    """(callable, ecotrain.json) of an exported file."""
    user_path(path, "predict", "give a .pt2 or .onnx file that `ecotrain export` wrote")
    if path.suffix.lower() == ".onnx":
        session = onnxfile.load(path)
        return session, session.meta
    try:
        ep, meta = load_pt2(path)
    except Exception as exc:  # a damaged or foreign archive: torch's own words, on one line
        raise ConfigError(f"{path}: not a readable torch.export archive ({' '.join(str(exc).split())[:200]})") \
            from None
    return ep.module(), meta


def read_data(path: Path, meta: dict) -> tuple[np.ndarray, np.ndarray | None]:
    """(features, labels or None) of an .npz or .csv file, for the model described by `meta`."""
    kind = path.suffix.lower()
    if kind == ".npz":
        try:
            with np.load(path, allow_pickle=False) as z:
                if "x" not in z.files:
                    raise DataError(f"{path}: missing array 'x' (found {list(z.files)}); save with np.savez(path, x=...)")
                return z["x"], (z["y"] if "y" in z.files else None)
        except (OSError, ValueError, zipfile.BadZipFile) as exc:
            raise DataError(f"{path}: cannot read as .npz ({exc})") from None
    if kind == ".csv":
        header, body = read_csv(path)
        target = meta.get("target")
        names = csv_features(header, meta.get("columns"), target, path)
        y = np.asarray(csv_numbers(path, header, body, [target]))[:, 0] if target in header else None
        return np.asarray(csv_numbers(path, header, body, names)), y
    raise DataError(f"--data {path}: not a .npz or .csv file")


def check_inputs(x: np.ndarray, meta: dict, data: Path, model: Path) -> torch.Tensor:
    """The features as the tensor the program takes: its dtype, and the sizes it fixes."""
    spec = meta.get("inputs") or []
    if len(spec) != 1:
        raise ConfigError(f"predict {model}: the model takes {len(spec) or 'unknown'} inputs; predict feeds one (x)")
    want = spec[0]["shape"][1:]
    have = list(x.shape[1:])
    if len(want) != len(have) or any(isinstance(w, int) and w != h for w, h in zip(want, have)):
        said = ["any" if isinstance(w, dict) else str(w) for w in want]
        raise DataError(f"--data {data}: samples have shape {tuple(have)}, but {model} takes ({', '.join(said)})")
    if x.dtype.kind not in "biuf":
        raise DataError(f"--data {data}: features must be numbers, got dtype {x.dtype}")
    return torch.as_tensor(np.ascontiguousarray(x), dtype=getattr(torch, spec[0]["dtype"]))


@torch.inference_mode()
def predict_exported(model_path, data: list[str], out) -> tuple[int, Path]:
    """Class predictions and probabilities of every row of one data file, by the exported model alone."""
    model_path, out = Path(model_path), Path(out)
    files = [d for d in data if "=" not in d]
    if len(files) != 1 or len(data) != 1:
        raise ConfigError(f"predict {model_path}: give --data ONE .npz or .csv file (an exported model has no run "
                          "data section to override)")
    data_path = user_path(files[0], "--data", "give the .npz or .csv file", error=DataError)
    if out.is_dir() or not out.parent.is_dir():
        raise ConfigError(f"--out {out}: give a file path in a folder that exists")
    refuse_overwriting(out, "--out", [data_path, model_path])
    fn, meta = load_exported(model_path)
    if meta.get("task") not in (None, "classification"):
        raise ConfigError(f"predict: {model_path} is a {meta['task']} model; predict writes class probabilities "
                          "of classifiers")
    x_np, y = read_data(data_path, meta)
    x = check_inputs(x_np, meta, data_path, model_path)
    if not len(x):
        raise DataError(f"--data {data_path}: holds no rows to predict")
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    for start in range(0, len(x), BATCH):
        logits = fn(x[start:start + BATCH])
        logits = logits[0] if isinstance(logits, (tuple, list)) else logits
        if logits.dim() != 2:
            raise ConfigError(f"predict: the model's output has shape {tuple(logits.shape)}, not (samples, classes)")
        probs = torch.softmax(logits.float(), -1)
        if start == 0:
            w.writerow(["index", "prediction", *(["label"] if y is not None else []),
                        *(f"prob_{k}" for k in range(probs.shape[1]))])
        for i, (p, row) in enumerate(zip(probs.argmax(-1).tolist(), probs.tolist()), start=start):
            w.writerow([i, p, *([int(y[i])] if y is not None else []), *(f"{v:.6g}" for v in row)])
    atomic_write(out, buf.getvalue().encode())
    return len(x), out


def cmd_predict_exported(args, ctx) -> int:
    """`ecotrain predict MODEL.pt2|.onnx` (cli_models.cmd_predict hands an exported file here)."""
    for flag in ("split", "registry", "cohort", "domain"):
        if getattr(args, flag, None) is not None:
            raise ConfigError(f"--{flag}: not with an exported model ({args.target}); it is one program, given "
                              "one data file")
    rows, path = predict_exported(args.target, args.data, args.out)
    ctx.committed()
    print(f"wrote {rows} predictions to {path}")
    return 0
