"""The run folder's layout: the one place that names its files.

A run folder holds what `fit` writes and later commands read. Reach a file through `RunFiles(path)`
(`RunFiles(run).summary`) or, for a name alone (a message, a listing), the constants below; no
module spells a run file's name itself, so a rename or a new file is one change here.

    config.yaml         the config as trained (rundir.write_config; `resume` reads it back)
    metrics.jsonl       one line per log interval and evaluation (callbacks/metrics_log.py)
    summary.json        the result (finish.Summary)
    ledger.json         the cost ledger (accounting/ledger.py)
    environment.json    versions, hardware, the dataset's hash (environment.py)
    model.safetensors   the final (best) weights; export.safetensors: the methods' extra tensors
    checkpoints/        step-N checkpoints (checkpoint/manager.py)
    tokenizer.json      the data's tokenizer (data/tokenizer.py), for predict and export
    memory_plan.json    memory.budget's choice (memory/planner.py); micro_batches.json: OOM recovery's count
    mlflow.json         the MLflow run's ids (tracking/mlflow_tracker.py); tensorboard/: its event files
    report.html         `ecotrain report`'s page (not the run's own: reading never depends on it)
    error.log           the CLI's tracebacks (cli.program._failed)
    .ecotrain.lock      the one-writer lock (rundir.acquire)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
LEDGER = "ledger.json"
ENVIRONMENT = "environment.json"
MODEL = "model.safetensors"
EXPORT = "export.safetensors"
CHECKPOINTS = "checkpoints"
TOKENIZER = "tokenizer.json"
MEMORY_PLAN = "memory_plan.json"
MICRO_BATCHES = "micro_batches.json"
MLFLOW = "mlflow.json"
TENSORBOARD = "tensorboard"
REPORT = "report.html"
ERROR_LOG = "error.log"
LOCK = ".ecotrain.lock"

# The most of a tokenizer.json any reader takes (base/safefile.py): GPT-2's 50k-id BPE is ~1.4 MiB, one of
# data/tokenizer.py's MAX_BPE_VOCAB ids ~50 MiB; a bigger file is refused in one line, not parsed
TOKENIZER_MAX_BYTES = 64 << 20

# What a run writes; a folder holding any of them holds a run (rundir.holds_run).
RUN_FILES = (CONFIG, METRICS, SUMMARY, LEDGER, MODEL, CHECKPOINTS, REPORT, ENVIRONMENT, EXPORT, MLFLOW, TENSORBOARD,
             MEMORY_PLAN, MICRO_BATCHES, TOKENIZER)
OWN = tuple(f for f in RUN_FILES if f != REPORT)  # the run's own files: what training writes, later commands read
MARKS = (METRICS, SUMMARY, MODEL, CHECKPOINTS)  # with config.yaml: the folder holds a run


@dataclass(frozen=True)
class RunFiles:
    """The paths of one run folder's files."""

    root: Path

    def __init__(self, root) -> None:
        object.__setattr__(self, "root", Path(root))

    def __truediv__(self, name: str) -> Path:
        return self.root / name

    @property
    def config(self) -> Path:
        return self.root / CONFIG

    @property
    def metrics(self) -> Path:
        return self.root / METRICS

    @property
    def summary(self) -> Path:
        return self.root / SUMMARY

    @property
    def ledger(self) -> Path:
        return self.root / LEDGER

    @property
    def environment(self) -> Path:
        return self.root / ENVIRONMENT

    @property
    def model(self) -> Path:
        return self.root / MODEL

    @property
    def export(self) -> Path:
        return self.root / EXPORT

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS

    @property
    def tokenizer(self) -> Path:
        return self.root / TOKENIZER

    @property
    def memory_plan(self) -> Path:
        return self.root / MEMORY_PLAN

    @property
    def micro_batches(self) -> Path:
        return self.root / MICRO_BATCHES

    @property
    def mlflow(self) -> Path:
        return self.root / MLFLOW

    @property
    def report(self) -> Path:
        return self.root / REPORT

    @property
    def error_log(self) -> Path:
        return self.root / ERROR_LOG

    @property
    def lock(self) -> Path:
        return self.root / LOCK
