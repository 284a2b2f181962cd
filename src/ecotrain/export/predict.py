"""`ecotrain predict MODEL.pt2|MODEL.onnx --data FILE --out CSV`: predictions from an exported file alone.

No run folder, no config, no model class: the program is the file (torch.export.load, or an
onnxruntime session), and what ecotrain needs besides it (the task, the input's dtype and shape, a CSV
run's column names) is the `ecotrain.json` written inside it, checked (export/meta.py). The data is
one .npz (`x`, optional `y`) or .csv (the model's columns by name; the target column, when there, is
the label), checked as `predict RUN` checks it (contract.py: names, width, dtype, finiteness). The CSV
written is `ecotrain predict`'s: index, prediction, label (when given), prob_0 ... prob_{K-1}.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import torch

from ecotrain.export import contract
from ecotrain.base.objects import describe
from ecotrain.base.errors import ConfigError, DataError, EcotrainError
from ecotrain.export import onnxfile
from ecotrain.export.meta import DTYPES, check_meta, dims
from ecotrain.export.program import load_pt2
from ecotrain.base.rundir import atomic_write, refuse_overwriting
from ecotrain.base.userpath import user_path

SUFFIXES = (".pt2", ".onnx")
BATCH = 1024  # rows per call


def is_exported(target: str) -> bool:
    return Path(target).suffix.lower() in SUFFIXES


def load_exported(path: Path, extra: dict | None = None):
    """(callable, ecotrain.json checked) of an exported file; `extra`, when given, gets the other files
    it carries (a language model's tokenizer.json)."""
    user_path(path, "predict", "give a .pt2 or .onnx file that `ecotrain export` wrote")
    if path.suffix.lower() == ".onnx":
        session = onnxfile.load(path)
        if extra is not None:
            extra.update(session.extra)
        return session, check_meta(session.meta, path)
    ep, meta = load_pt2(path, extra)  # CheckpointError, one line: damaged, foreign, or would run code
    return ep.module(), check_meta(meta, path)


def read_inputs(data: Path, meta: dict, model: Path) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(the features as the tensor the program takes, labels or None): the input contract of
    contract.py, as `predict RUN` checks it, against the spec inside the file."""
    spec = meta.get("inputs") or []
    if len(spec) != 1:
        raise ConfigError(f"predict {model}: the model takes {len(spec) or 'unknown'} inputs; predict feeds one (x)")
    what = f"--data {data}"
    x, y = contract.read_file(data, meta.get("columns"), bool(meta.get("columns_chosen")), meta.get("target"),
                              what, model)
    contract.check_shape(x.shape[1:], dims(spec[0]), what, model)
    if y is not None:
        contract.check_label_range(y, meta.get("num_classes"), what)
    dtype = DTYPES[spec[0]["dtype"]]
    if not dtype.is_floating_point and not torch.equal(x, x.round()):
        row = int((x != x.round()).reshape(len(x), -1).any(1).nonzero()[0, 0])
        raise DataError(f"{what}: the model takes whole numbers ({spec[0]['dtype']}), but row {row} holds a fraction")
    return x.to(dtype), y


def run_program(fn, x: torch.Tensor, model: Path) -> torch.Tensor:
    """The program's logits; its own refusal (a guard on the input's shape or dtype, which the spec
    in ecotrain.json did not match) is one line."""
    try:
        out = fn(x)
    except EcotrainError:
        raise
    except Exception as exc:
        raise DataError(f"predict: {model} refused the input ({describe(exc)}); the input spec in its "
                        "ecotrain.json does not match its program: re-export the run with `ecotrain export`") from None
    return out[0] if isinstance(out, (tuple, list)) else out


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
    if meta.get("task") == "language_model":
        raise ConfigError(f"predict: {model_path} is a language model; give --prompt TEXT or --prompts FILE "
                          "(one prompt per line) to continue, not --data")
    if meta.get("task") not in (None, "classification"):
        raise ConfigError(f"predict: {model_path} is a {meta['task']} model; predict writes class probabilities "
                          "of classifiers")
    x, y = read_inputs(data_path, meta, model_path)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    for start in range(0, len(x), BATCH):
        logits = run_program(fn, x[start:start + BATCH], model_path)
        if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
            raise ConfigError(f"predict: the model's output has shape {tuple(getattr(logits, 'shape', ()))}, not "
                              "(samples, classes)")
        contract.check_outputs(logits, start, model_path)
        probs = torch.softmax(logits.float(), -1)
        if start == 0:
            w.writerow(["index", "prediction", *(["label"] if y is not None else []),
                        *(f"prob_{k}" for k in range(probs.shape[1]))])
        for i, (p, row) in enumerate(zip(probs.argmax(-1).tolist(), probs.tolist()), start=start):
            w.writerow([i, p, *([int(y[i])] if y is not None else []), *(f"{v:.6g}" for v in row)])
    atomic_write(out, buf.getvalue().encode())
    return len(x), out


def cmd_predict_exported(args, ctx) -> int:
    """`ecotrain predict MODEL.pt2|.onnx` (cli/commands/predict.py's run hands an exported file here)."""
    for flag in ("split", "registry", "cohort", "domain"):
        if getattr(args, flag, None) is not None:
            raise ConfigError(f"--{flag}: not with an exported model ({args.target}); it is one program, given "
                              "one data file")
    if args.out is None:
        raise ConfigError(f"predict {args.target}: give --data FILE and --out CSV (a language model: --prompt TEXT)")
    rows, path = predict_exported(args.target, args.data, args.out)
    ctx.committed()
    print(f"wrote {rows} predictions to {path}")
    return 0
