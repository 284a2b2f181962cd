"""A run folder as the report sees it: its files only (the report never reaches into a trainer).

config.yaml, metrics.jsonl, summary.json, ledger.json, environment.json, mlflow.json, checkpoints/,
tensorboard/ and the weights files; every one but config.yaml or metrics.jsonl may be missing (an
unfinished run has no summary), and a damaged one is a note in the report, not a failure.
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ecotrain.base import safefile
from ecotrain.accounting.report import LEDGER_FIELDS, SUMMARY_STRINGS, check_numbers, check_readable
from ecotrain.base.errors import ConfigError
from ecotrain.base.jsonfile import read_json
from ecotrain.base.runfiles import CHECKPOINTS, CONFIG, ENVIRONMENT, LEDGER, METRICS, MLFLOW, SUMMARY


@dataclass
class RunData:
    path: Path
    name: str
    config: dict = field(default_factory=dict)
    config_text: str = ""
    summary: Optional[dict] = None
    ledger: Optional[dict] = None
    environment: Optional[dict] = None
    mlflow: Optional[dict] = None
    logs: list = field(default_factory=list)  # metrics.jsonl log records (training loss, lr, live cost)
    evals: list = field(default_factory=list)  # metrics.jsonl evaluation records (val_*)
    checkpoints: list = field(default_factory=list)  # {"name", "step", "complete", "bytes"}
    files: list = field(default_factory=list)  # (name, bytes) of the run folder's top-level files
    notes: list = field(default_factory=list)  # what could not be read

    def series(self, key: str, records: Optional[list] = None) -> list[tuple[int, float]]:
        """(step, value) of `key` in the log records (`loss`, `lr`) or the evaluations (`val_*`)."""
        if records is None:
            records = self.evals if key.startswith("val_") else self.logs
        out = []
        for r in records:
            v = r.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and "step" in r:
                out.append((int(r["step"]), float(v)))
        return out

    @property
    def is_lm(self) -> bool:
        """A language model's run: its evaluations hold val_perplexity."""
        return any("val_perplexity" in r for r in self.evals)

    def train_perplexity(self) -> list[tuple[int, float]]:
        """(step, exp of the training loss) per log record: the task's own loss (`loss_task`) when
        methods add terms to `loss`."""
        key = "loss_task" if any("loss_task" in r for r in self.logs) else "loss"
        return [(s, math.exp(min(v, 700.0))) for s, v in self.series(key)]

    @property
    def metric(self) -> Optional[str]:
        """The validation metric to plot: val_perplexity for a language model, else val_accuracy when
        there is one, else the first other val_* key."""
        keys = [k for r in self.evals for k in r if k.startswith("val_") and k != "val_loss"]
        for k in ("val_perplexity", "val_accuracy"):
            if k in keys:
                return k
        return keys[0] if keys else None

    @property
    def label(self) -> str:
        return f"{self.name} ({self.path.name})" if self.path.name != self.name else self.name


def _json(path: Path, notes: list, what: str, fields: Optional[dict] = None) -> Optional[dict]:
    """The file read back as every command does (jsonfile.py), or None with a note: a hand-edited or
    damaged file is left out of the page, never met by its arithmetic."""
    if not path.is_file():
        return None
    try:
        obj = read_json(path, what, fields)
        check_numbers(obj, path, SUMMARY_STRINGS if path.name == SUMMARY else frozenset())
    except ConfigError as exc:
        notes.append(f"{exc}; left out of the report")
        return None
    return obj


def read_run(run_dir) -> RunData:
    import yaml

    path = Path(run_dir)
    if not path.is_dir():
        raise ConfigError(f"{run_dir}: not a run folder (no such folder)" if not path.exists()
                          else f"{run_dir}: a file, not a run folder")
    if not (path / CONFIG).is_file() and not (path / METRICS).is_file():
        raise ConfigError(f"{run_dir}: not a run folder (no config.yaml, no metrics.jsonl); "
                          "give the folders that `ecotrain fit` wrote")
    run = RunData(path=path, name=path.name)
    try:
        run.config_text = safefile.read_text(path / CONFIG, "run config", 16 * safefile.MiB)
        cfg = yaml.safe_load(run.config_text)
        run.config = cfg if isinstance(cfg, dict) else {}
    except (OSError, ValueError, yaml.YAMLError, RecursionError) as exc:
        run.notes.append(f"config.yaml: not readable ({type(exc).__name__})")
    except ConfigError as exc:  # a FIFO, a device, not UTF-8, too big: safefile's line says which
        run.notes.append(f"config.yaml: not readable ({exc})")
    run.name = str(run.config.get("name") or path.name)
    run.summary = _json(path / SUMMARY, run.notes, "run summary")
    if not (path / SUMMARY).is_file() and (path / CONFIG).is_file():
        run.notes.append("no summary.json: the run did not finish (or is still running)")
    run.ledger = _json(path / LEDGER, run.notes, "ledger", LEDGER_FIELDS)
    if run.ledger is not None:
        try:
            check_readable(run.ledger, path / LEDGER)
        except ConfigError as exc:
            run.notes.append(f"{exc}; left out of the report")
            run.ledger = None
    run.environment = _json(path / ENVIRONMENT, run.notes, "environment record")
    run.mlflow = _json(path / MLFLOW, run.notes, "MLflow record")
    _read_metrics(run)
    _read_checkpoints(run)
    run.files = sorted((p.name, p.stat().st_size) for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    return run


def _read_metrics(run: RunData) -> None:
    p = run.path / METRICS
    if not p.is_file():
        run.notes.append("no metrics.jsonl")
        return
    bad = 0
    try:
        raw = safefile.open_regular(p, "metrics log")
    except (OSError, ConfigError) as exc:  # a FIFO in its place: a note, never a wait
        run.notes.append(f"metrics.jsonl: not readable ({exc})")
        return
    with io.TextIOWrapper(raw, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                bad += 1
                continue
            if not isinstance(rec, dict) or "step" not in rec:
                bad += 1
            elif "loss" in rec:
                run.logs.append(rec)
            elif any(k.startswith("val_") for k in rec):
                run.evals.append(rec)
    if bad:
        run.notes.append(f"metrics.jsonl: {bad} unreadable line(s) skipped")


def _read_checkpoints(run: RunData) -> None:
    root = run.path / CHECKPOINTS
    if not root.is_dir():
        return
    for p in sorted(root.iterdir()):
        name = p.name
        if not (p.is_dir() and name.startswith("step-") and name[5:].isdigit()):
            continue
        size = sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
        run.checkpoints.append({"name": name, "step": int(name[5:]), "complete": (p / "MANIFEST.json").is_file(),
                                "bytes": size})
