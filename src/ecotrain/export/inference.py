"""`ecotrain eval` and `ecotrain predict`: a trained model on any supported data, always in eval mode.

The model is rebuilt as it was trained, from a run folder (config.yaml + model.safetensors, the
final weights) or a checkpoint folder (the config and model weights in its meta.json and tensors;
verified first): the model section of the config, the input shape and class count of the run's own
data (so that data must still be readable), the methods' `transform` (a BatchNorm -> GroupNorm swap),
then the weights, which must match it key for key and shape for shape.

The data (`--data`): nothing for the run's own data; a `.npz` or `.csv` file, read by the same
loaders as training (no hold-out taken from it); and/or `key=value` overrides of the run's data
section (`num_samples=2000`, `data.kwargs.seed=7`), validated like a recipe. The split: `test` by
default, or the whole data when it has no test split (a file without `x_test`/`y_test`); `--split`
picks test, val, train or all. A file for `predict` may lack labels (`.npz` without `y`, `.csv`
without the target column).

eval prints its metrics and writes them as JSON (default: RUN/eval-<label>.json; for a checkpoint
RUN/eval-<checkpoint>-<label>.json, or beside a bare checkpoint); predict writes a CSV of the
predicted class and every class probability. Both write atomically, after every check has passed,
so a refused command leaves nothing behind.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch
from torch import nn

from ecotrain.base import safefile
from ecotrain.core import loop
from ecotrain.export import contract
from ecotrain.accounting.report import read_summary
from ecotrain.checkpoint import list_checkpoints, read_checkpoint
from ecotrain.checkpoint.format import load_state_dict_file, unflatten
from ecotrain.checkpoint.snapshot import load_model_weights
from ecotrain.config import Config, build_config, load_config, merge_trees, parse_overrides
from ecotrain.data import ArraySource, DataBundle, load_data
from ecotrain.core.device import resolve_device
from ecotrain.data.sources import subset
from ecotrain.data.builtin import read_csv
from ecotrain.base.data_formats import FILES
from ecotrain.base.errors import CheckpointError, ConfigError, DataError, EcotrainError
from ecotrain.base.log import log
from ecotrain.methods import build_methods
from ecotrain.methods.bn_domain import serving, use_domain
from ecotrain.models import build_model
from ecotrain.base.rundir import atomic_write, refuse_overwriting
from ecotrain.core.task import build_task
from ecotrain.base.userpath import user_path
from ecotrain.base.runfiles import CHECKPOINTS, CONFIG, MODEL, SUMMARY

SPLITS = ("test", "val", "train", "all")


@dataclass
class Trained:
    """A trained model, rebuilt and in eval mode, with what it was trained on."""

    model: nn.Module
    config: Config
    bundle: DataBundle  # the run's own data: the model's input shape and classes
    device: torch.device
    source: Path  # the run folder or checkpoint folder given
    weights: str  # where the weights came from
    out_dir: Path  # where eval writes by default
    prefix: str  # "" for a run folder, "<checkpoint>-" for a checkpoint
    columns: Optional[list[str]] = None  # trained on a table (CSV, Parquet, hf:): its feature columns, by name

    @property
    def is_lm(self) -> bool:
        return self.bundle.extra.get("task") == "lm"


def _locate(path: Path):
    """(config, state_dict, weights description, default output folder, prefix) of a run or checkpoint folder."""
    if not path.exists():
        raise ConfigError(f"{path}: not found; give a run folder or a checkpoint folder")
    if not path.is_dir():
        raise ConfigError(f"{path}: a file, not a run folder (config.yaml + model.safetensors) nor a checkpoint "
                          "folder; weights alone do not say which model they are for")
    if (path / "MANIFEST.json").exists() or (path / "meta.json").exists():
        tensors, meta = read_checkpoint(path)  # verified: manifest, checksums, headers
        if "sharded" in meta:
            raise CheckpointError(f"{path}: a sharded (FSDP) checkpoint; evaluate its run folder's model.safetensors, "
                                  "or a checkpoint saved without FSDP")
        if not isinstance(meta.get("config"), dict):
            raise CheckpointError(f"{path}: meta.json holds no config")
        cfg = build_config(meta["config"], f"{path}/meta.json config")
        weights = unflatten(meta, tensors).get("model")
        run = path.parent.parent
        if path.parent.name == CHECKPOINTS and (run / CONFIG).is_file():
            return cfg, weights, f"{path} (model weights)", run, f"{path.name}-"
        return cfg, weights, f"{path} (model weights)", path.parent, f"{path.name}-"
    if not (path / CONFIG).is_file():
        raise ConfigError(f"{path}: not a run folder (no config.yaml) nor a checkpoint folder (no MANIFEST.json)")
    cfg = load_config(path / CONFIG)
    file = path / MODEL
    if not file.is_file():
        ckpts = list_checkpoints(path)
        hint = f"; evaluate a checkpoint instead: ecotrain eval {ckpts[0]}" if ckpts else ""
        raise ConfigError(f"{path}: no model.safetensors, so the run has not finished{hint}")
    return cfg, load_state_dict_file(file), str(file), path, ""


def load_trained(target: str | Path, device: str = "auto") -> Trained:
    """Rebuild the model of a run folder or checkpoint folder with its weights, in eval mode."""
    path = Path(target)
    cfg, weights, where, out_dir, prefix = _locate(path)
    columns = kept_columns(path, prefix, out_dir, cfg)
    data_cfg = cfg
    if columns and not cfg.data.features and cfg.data.name == "csv":  # its own file, by the names kept
        data_cfg = cfg.model_copy(deep=True)
        data_cfg.data.features = columns
    try:
        bundle = load_data(data_cfg)
    except EcotrainError as exc:
        raise type(exc)(f"{path}: rebuilding the model needs its training data's shape and classes, "
                        f"and that data cannot be loaded: {exc}") from None
    model = build_model(cfg.model, bundle.input_shape, bundle.num_classes)
    methods = build_methods(cfg)
    if methods.transforms:  # the model as it was trained: a BatchNorm -> GroupNorm swap, adapters, ...
        model = methods.transform(model)
    load_model_weights(model, weights, where)
    dev = resolve_device(device)
    model = model.to(dev).eval()
    columns = columns or (bundle.extra.get("inputs") or {}).get("columns")  # a run from before they were kept
    return Trained(model, cfg, bundle, dev, path, where, out_dir, prefix, columns)


def kept_columns(path: Path, prefix: str, out_dir: Path, cfg: Config) -> Optional[list[str]]:
    """The feature columns a model trained on a table (CSV, Parquet, hf:) takes, as its run's summary.json
    keeps them (None: no named columns, or no finished run to say: a checkpoint of a running one)."""
    in_a_run = path.parent.name == CHECKPOINTS and path.parent.parent == out_dir  # RUN/checkpoints/step-N
    run = path if not prefix else out_dir if in_a_run else None
    if run is None or not (run / SUMMARY).is_file():
        return None
    summary = read_summary(run, {"inputs?": dict, "inputs.columns?": list, "inputs.columns.*?": str})
    return list((summary.get("inputs") or {}).get("columns") or []) or None


# -- the data -----------------------------------------------------------------------------------
def data_config(cfg: Config, items: Sequence[str]) -> tuple[Config, str]:
    """The config of the data to evaluate: the run's, with `--data` (a file and/or overrides) applied,
    and a short label for it (file stem or data name)."""
    files = [a for a in items if "=" not in a]
    overrides = [a for a in items if "=" in a]
    if len(files) > 1:
        raise ConfigError(f"--data: one file at most (got {', '.join(files)}), plus key=value overrides of the "
                          "data section")
    tree = cfg.to_dict()
    label = cfg.data.name
    if files:
        f = Path(files[0])
        kind = f.suffix.lower().lstrip(".")
        if kind not in FILES:
            raise DataError(f"--data {f}: not a .npz or .csv file; give one, or key=value overrides of the run's data "
                            "section (e.g. num_samples=2000)")
        user_path(f, "--data", f"give the .{kind} file", error=DataError)  # read before the loader checks it
        tree["data"] = {**tree["data"], "name": kind, "path": str(f), "val_split": 0.0, "test_split": 0.0,
                        "kwargs": {}, "augment": {}, "bucketing": False}
        label = f.stem
    if overrides:
        dotted = [o if o.startswith("data.") else f"data.{o}" for o in overrides]
        tree = merge_trees(tree, parse_overrides(dotted))
    return build_config(tree, "--data"), label


def _labelled(cfg: Config) -> bool:
    """Whether a data file holds labels (`y` in an npz, the target column in a csv); other sources always do."""
    path = Path(cfg.data.path or "")
    try:
        if cfg.data.name == "npz":
            with safefile.open_regular(path, "data file") as f, np.load(f, allow_pickle=False) as z:
                return "y" in z.files  # through safefile: a FIFO there must not hang predict
        if cfg.data.name == "csv":
            header, _ = read_csv(path, header_only=True)
            return cfg.data.target in header
    except Exception:  # unreadable: the loader says why, in one line
        return True
    return True


def _features_only(cfg: Config) -> ArraySource:
    """An unlabelled .npz (`x`) or .csv (every column a feature), checked like training data; labels -1."""
    path = Path(cfg.data.path)  # a CSV's every column a feature, or data.features (by_name's) in that order
    xt, _ = contract.read_file(path, cfg.data.features, True, None, f"--data {path}", path, say=False)  # by_name said
    return ArraySource(xt, torch.full((len(xt),), -1, dtype=torch.long))


class Concat:
    """Splits one after the other (a Source; `take` expects ascending indices, as evaluation gives)."""

    def __init__(self, parts):
        self.parts = [p for p in parts if p is not None]
        self.starts = np.cumsum([0] + [len(p) for p in self.parts]).tolist()

    def __len__(self) -> int:
        return self.starts[-1]

    def take(self, idx):
        xs, ys = [], []
        for part, lo, hi in zip(self.parts, self.starts, self.starts[1:]):
            sel = idx[(idx >= lo) & (idx < hi)] - lo
            if len(sel):
                x, y = part.take(sel)
                xs.append(x)
                ys.append(y)
        return torch.cat(xs), torch.cat(ys)

    def labels(self):
        return torch.cat([p.labels() for p in self.parts])


def _pick(bundle: DataBundle, split: Optional[str], what: str):
    """(source, split name)."""
    if split is None:
        split = "test" if bundle.test is not None else "all"
    if split == "all":
        return Concat([bundle.train, bundle.val, bundle.test]), "all"
    src = getattr(bundle, split)
    if src is None:
        raise DataError(f"{what}: has no {split} split; choose --split from "
                        f"{', '.join(s for s in SPLITS if s == 'all' or getattr(bundle, s) is not None)}")
    return src, split


def eval_data(trained: Trained, items: Sequence[str], split: Optional[str], need_labels: bool = True):
    """(source, split, label, labelled): the data to run the model on, checked against the model."""
    if split is not None and split not in SPLITS:
        raise ConfigError(f"--split {split}: choose from {', '.join(SPLITS)}")
    cfg = trained.config
    if not items:
        src, split = _pick(trained.bundle, split, f"{trained.source}: the run's data")
        return src, split, split, True
    dcfg, label = data_config(cfg, items)
    what = f"--data {' '.join(items)}"
    dcfg = by_name(dcfg, trained, what)
    if not need_labels and dcfg.data.name in FILES and not _labelled(dcfg):
        if split not in (None, "all"):
            raise DataError(f"{what}: an unlabelled file is predicted whole; drop --split")
        src, split, labelled = _features_only(dcfg), "all", False
    else:
        src, split = _pick(load_data(dcfg), split, what)
        labelled = True
    x0, _ = src.take(torch.tensor([0]))
    contract.check_shape(x0.shape[1:], trained.bundle.input_shape, what, trained.source, "was trained on")
    if labelled and not trained.is_lm:
        contract.check_label_range(src.labels(), trained.bundle.num_classes, what)
    return src, split, f"{label}-{split}", labelled


def by_name(dcfg: Config, trained: Trained, what: str) -> Config:
    """A CSV's columns matched to the model's by name (its input contract): the same names in another
    order are read in the training order (said in one line); a missing column, or one the model does not
    know, is refused, naming them. A run that chose its columns (data.features) ignores the others, as its
    training did. An .npz has no names: taken in the training order, said so."""
    want = trained.columns
    if not want or dcfg.data.name not in FILES:
        return dcfg
    if dcfg.data.name == "npz":
        log.info(f"{what}: an .npz has no column names; its features are taken as the model's columns, in order "
                 f"({', '.join(want)})")
        return dcfg
    header, _ = read_csv(Path(dcfg.data.path), header_only=True)
    dcfg.data.features = contract.match_columns(header, want, dcfg.data.target, bool(trained.config.data.features),
                                                what, trained.source)
    return dcfg


# -- eval and predict ---------------------------------------------------------------------------
def writable(path: Path, flag: str, reads=()) -> Path:
    """`reads`: the files the command reads (its --data), which the output must not replace."""
    if path.is_dir():
        raise ConfigError(f"{flag} {path}: is a folder; give a file path")
    if not path.parent.is_dir():
        raise ConfigError(f"{flag} {path}: the folder {path.parent} does not exist")
    refuse_overwriting(path, flag, reads)
    return path


def write_out(path: Path, data: bytes, flag: str) -> None:
    try:
        atomic_write(path, data)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot write ({exc.strerror or exc}); choose another {flag}") from None


def evaluate(target, data: Sequence[str] = (), split: Optional[str] = None, out: Optional[str | Path] = None,
             device: str = "auto", domain: Optional[str] = None) -> tuple[dict, Path]:
    """Evaluate a run folder's or checkpoint's model in eval mode; write the metrics JSON. Returns (metrics, path).
    `domain`: the BatchNorm statistics of that domain (a model trained with `policy: domain`; an unknown
    key gets the pre-trained ones); without it, an .npz's `domain` column routes each row to its own."""
    trained = load_trained(target, device)
    src, split, label, _ = eval_data(trained, list(data), split)
    stats, column = serving(trained, domain, list(data), split, len(src))
    path = Path(out) if out else trained.out_dir / f"eval-{trained.prefix}{label}.json"
    writable(path, "--out", data)
    cfg = trained.config
    task = build_task(cfg, lm=trained.is_lm)
    extra: dict = {}
    if stats is not None and domain is not None:
        extra = {"domain": domain, "bn_statistics": use_domain(trained.model, stats, domain)}
    if column is None:
        got = loop.evaluate(trained.model, src, task, cfg.data.batch_size * 4, trained.device, None, prefix="m")
        metrics = {k.removeprefix("m_"): v for k, v in got.items()}
    else:  # each domain's rows with its own statistics; loss and accuracy are sample means, so they combine
        per = {}
        for key in sorted(set(column.tolist())):
            rows = torch.from_numpy(np.flatnonzero(column == key))
            used = use_domain(trained.model, stats, key)
            got = loop.evaluate(trained.model, subset(src, rows), task, cfg.data.batch_size * 4, trained.device,
                                None, prefix="m")
            per[key] = {"samples": len(rows), "bn_statistics": used, **{k.removeprefix("m_"): v for k, v in got.items()}}
        metrics = {k: sum(r[k] * r["samples"] for r in per.values()) / len(src) for k in ("loss", "accuracy")
                   if all(k in r for r in per.values())}
        extra = {"domains": per}
    record = {"model": str(trained.source), "weights": trained.weights,
              "data": " ".join(data) if data else f"the run's own data ({cfg.data.name})", "split": split,
              "samples": len(src), "mode": "eval", **metrics, **extra}
    write_out(path, (json.dumps(record, indent=2, sort_keys=True) + "\n").encode(), "--out")
    return record, path


@torch.inference_mode()
def predict(target, data: Sequence[str], out: str | Path, split: Optional[str] = None,
            device: str = "auto", domain: Optional[str] = None) -> tuple[int, Path]:
    """Class predictions and probabilities of every sample as CSV: index, prediction, label (when the
    data has labels), prob_0 ... prob_{K-1}. Returns (rows, path). `domain`: as `evaluate`'s."""
    path = writable(Path(out), "--out", data)
    trained = load_trained(target, device)
    if trained.is_lm:
        raise ConfigError(f"predict: {target} is a language model; give --prompt TEXT or --prompts FILE (one prompt "
                          "per line) to continue, not --data")
    src, split, _, labelled = eval_data(trained, list(data), split, need_labels=False)
    stats, column = serving(trained, domain, list(data), split, len(src))
    if stats is not None and domain is not None:
        use_domain(trained.model, stats, domain)
    model, dev, bs = trained.model, trained.device, trained.config.data.batch_size * 4
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    n_cls = None
    for start in range(0, len(src), bs):
        x, y = src.take(torch.arange(start, min(start + bs, len(src))))
        if column is None:
            out_ = model(x.to(dev))
        else:  # the batch's rows of each domain with that domain's statistics, put back in row order
            keys = column[start:start + len(x)]
            out_ = None
            for key in sorted(set(keys.tolist())):
                rows = torch.from_numpy(np.flatnonzero(keys == key))
                use_domain(model, stats, key)
                part = model(x[rows].to(dev))
                out_ = part.new_empty((len(x), *part.shape[1:])) if out_ is None else out_
                out_[rows.to(dev)] = part
        if out_.dim() != 2:
            raise ConfigError(f"predict: the model's output has shape {tuple(out_.shape)}, not (samples, classes)")
        contract.check_outputs(out_, start, trained.source)
        probs = torch.softmax(out_.float(), -1).cpu()
        if n_cls is None:
            n_cls = probs.shape[1]
            w.writerow(["index", "prediction", *(["label"] if labelled else []), *(f"prob_{k}" for k in range(n_cls))])
        pred = probs.argmax(-1)
        for i in range(len(probs)):
            w.writerow([start + i, int(pred[i]), *([int(y[i])] if labelled else []),
                        *(f"{float(p):.6g}" for p in probs[i])])
    write_out(path, buf.getvalue().encode(), "--out")
    return len(src), path
