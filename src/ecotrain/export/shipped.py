"""Which trained weights ship: a run folder's own, or, for a seed group (`fit --seeds` writes
RUN-group.json), the seed whose validation figure is best. The test split plays no part in the choice
(docs/evaluation.md, rule 1); the card reports the test figures of every seed instead.

No torch here: `ecotrain card` reads finished runs only.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import yaml

from ecotrain.accounting import read_ledger
from ecotrain.accounting.report import read_summary
from ecotrain.base import safefile
from ecotrain.base.errors import ConfigError
from ecotrain.base.jsonfile import LIMIT, RUN_FIX, read_json
from ecotrain.base.groupfile import GROUP_SUFFIX, read_group
from ecotrain.base.runfiles import CONFIG, ENVIRONMENT, LEDGER, MODEL, SUMMARY

SUMMARY_FIELDS = {"name": str, "monitor": str, "best_val_metric": (float, None), "best_step": (int, None),
                  "steps": int, "dataset_hash": str}


@dataclass
class Run:
    """A finished run folder, as the card and the export read it."""

    path: Path
    config: dict  # config.yaml as written (every key present: fit writes the validated config)
    summary: dict
    ledger: Optional[dict]  # None: no ledger.json (`ledger_note` says why)
    environment: dict = field(default_factory=dict)  # environment.json: the hardware, when there

    @property
    def seed(self) -> Optional[int]:
        return self.config.get("seed")

    @property
    def ledger_note(self) -> str:
        """Why there is no ledger: turned off, or a file that is gone."""
        if (self.config.get("ledger") or {}).get("enabled", True) is False:
            return "the run had ledger.enabled=false"
        return f"{self.path / LEDGER} is missing (restore it to state the training cost)"


@dataclass
class Shipped:
    """The run whose weights ship, and the seed group it was chosen from (None: a single run)."""

    run: Run
    group: list[Run] = field(default_factory=list)  # every seed of the group, the chosen one included
    group_file: Optional[Path] = None
    chosen_because: str = ""  # how the group's run was chosen, in words
    repeated: list[str] = field(default_factory=list)  # runs the group file lists more than once, counted once


def read_run(path: str | Path) -> Run:
    """A finished run folder: config.yaml, summary.json, model.safetensors; ledger.json when recorded."""
    path = Path(path)
    if not (path / CONFIG).is_file():
        raise ConfigError(f"{path}: not a run folder (no config.yaml); give a folder that `ecotrain fit` wrote, "
                          f"or a seed group's *{GROUP_SUFFIX}")
    if not (path / SUMMARY).is_file() or not (path / MODEL).is_file():
        raise ConfigError(f"{path}: the run has not finished (no summary.json or model.safetensors); "
                          "finish it with `ecotrain resume`")
    try:
        config = yaml.safe_load(safefile.read_text(path / CONFIG, "run config", LIMIT, fix=RUN_FIX))
    except (OSError, yaml.YAMLError) as exc:  # a FIFO, a device, a file too big, not UTF-8: safefile's one line
        raise ConfigError(f"{path / CONFIG}: not readable ({exc}); restore it, or run the training again") \
            from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path / CONFIG}: not a config; restore it, or run the training again")
    summary = read_summary(path, SUMMARY_FIELDS)
    ledger = read_ledger(path) if (path / LEDGER).is_file() else None
    env = path / ENVIRONMENT
    environment = read_json(env, "environment record") if env.is_file() else {}
    return Run(path, config, summary, ledger, environment)


def locate(target: str | Path) -> Shipped:
    """A run folder, or a group file: its seeds, and the one chosen on validation."""
    target = Path(target)
    if target.is_file() and target.name.endswith(".json"):
        return _group(target)
    if not target.exists():
        raise ConfigError(f"{target}: not found; give a run folder or a seed group's *{GROUP_SUFFIX}")
    return Shipped(read_run(target))


def _group(file: Path) -> Shipped:
    # one run folder listed twice (or by two paths) is one seed: counting it twice would fake a seed
    by_folder: dict[str, list[str]] = {}
    for p in read_group(file):
        by_folder.setdefault(os.path.realpath(p), []).append(p)
    repeated = [ps[0] for ps in by_folder.values() if len(ps) > 1]
    runs = [read_run(ps[0]) for ps in by_folder.values()]
    index, why = choose(runs)
    return Shipped(runs[index], runs, file, why, repeated)


def validation_figure(run: Run) -> Optional[float]:
    """The run's best validation figure of its monitor (summary.json), or None without a validation split."""
    best = run.summary.get("best_val_metric")
    if best is None:
        best = run.summary.get(run.summary["monitor"])
    return float(best) if isinstance(best, (int, float)) and math.isfinite(best) else None


def choose(runs: list[Run]) -> tuple[int, str]:
    """(index, why) of the run with the best validation figure; ties go to the first seed."""
    monitor = runs[0].summary["monitor"]
    mode = (runs[0].config.get("early_stopping") or {}).get("mode", "min")
    figures = [validation_figure(r) for r in runs]
    if any(f is None for f in figures):  # no validation figure to choose by: not the test split either
        return 0, (f"the first seed ({runs[0].seed}): the runs have no validation {monitor} to choose by, and the "
                   "test split is never used to choose")
    sign = 1.0 if mode == "min" else -1.0
    best = min(range(len(runs)), key=lambda i: (sign * figures[i], i))
    return best, (f"seed {runs[best].seed}: the best validation {monitor} of {len(runs)} seeds "
                  f"({figures[best]:.6g}; {mode} is better); the test split was not looked at")
