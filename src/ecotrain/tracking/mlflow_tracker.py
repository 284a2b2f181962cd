"""MLflow: a run in a real local store (`mlflow ui` opens it), written through `MlflowClient`.

What lands where (docs/report.md "Trackers"):
- params: the resolved config, flattened (`optim.lr`), at the start;
- metrics: every metrics.jsonl record under the same names (`loss`, `lr`, `val_loss`, `val_accuracy`,
  `loss_<term>`, `flops`, `energy_kwh`, `co2e_g`) at its step; summary.json's figures as `final.<key>`
  and the ledger's as `ledger.<figure>` at the end;
- tags: `ecotrain.run_dir`, `ecotrain.dataset_hash`, `ecotrain.stopped_because`,
  `ecotrain.energy_method`, `mlflow.source.git.commit` and `ecotrain.git_dirty` (environment.json);
- artifacts: the run folder's files (config.yaml, metrics.jsonl, summary.json, ledger.json,
  environment.json, model.safetensors, ...; checkpoints/ only with `checkpoints: true`).

The MLflow run id is kept in the checkpoint (state key `mlflow`) and in RUN/mlflow.json, so a resumed
run continues the same MLflow run (a metric logged again at a step after the checkpoint then has two
points at that step: MLflow cannot delete metric history). A preempted run ends KILLED and goes
back to RUNNING on resume; a run that raised ends FAILED.

A store that fails mid-run costs a warning and this tracker for the rest of the run, never the
training: metrics.jsonl stays complete.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

from ecotrain.base import safefile
from ecotrain.base.errors import ConfigError
from ecotrain.base.log import log
from ecotrain.base.rundir import write_json
from ecotrain.tracking.base import Tracker, flatten, numeric
from ecotrain.base.runfiles import CHECKPOINTS, MLFLOW, MODEL, RunFiles

BATCH = 1000  # MLflow's log_batch limit (metrics); params and tags: 100
FLUSH_EVERY = 500  # buffered metric points


def default_uri() -> str:
    """sqlite:///<working directory>/mlflow.db: MLflow's own default store, made absolute."""
    return f"sqlite:///{(Path.cwd() / 'mlflow.db').resolve()}"


def experiment_id(client, uri: str, name: str) -> str:
    """The id of experiment `name`, created if missing; with a sqlite store its artifacts live beside the
    database (mlartifacts/<name>), not in whatever the working directory is later. Also used by the
    registry on MLflow (continual/registry_mlflow.py)."""
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    location = None
    if uri.startswith("sqlite:///"):
        db = Path(uri.removeprefix("sqlite:///"))
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
        location = (db.parent / "mlartifacts" / safe).resolve().as_uri()
    try:
        return client.create_experiment(name, artifact_location=location)
    except Exception:  # another process created it meanwhile
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def _chunks(items: list, n: int):
    for i in range(0, len(items), n):
        yield items[i:i + n]


class MlflowTracker(Tracker):
    state_key = "mlflow"

    def __init__(self, cfg, run_dir: Path):
        from mlflow.tracking import MlflowClient

        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.uri = cfg.tracking_uri or default_uri()
        self.run_id: Optional[str] = None
        self.failed = False
        self._buffer: list = []
        try:  # opened now, during assembly: a bad store is one line before anything is written
            self.client = MlflowClient(tracking_uri=self.uri)
            self.experiment_id = self._experiment(cfg.experiment)
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(f"tracking.mlflow: cannot open the store {self.uri} ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0][:200] if str(exc) else ''})") from None

    def _experiment(self, name: str) -> str:
        return experiment_id(self.client, self.uri, name)

    # -- the run ---------------------------------------------------------------------------------
    def on_fit_start(self, state):
        from mlflow.entities import Param

        resumed = False
        if self.run_id is not None:  # a resume: the same MLflow run, if the store still has it
            try:
                self.client.get_run(self.run_id)
                self.client.update_run(self.run_id, status="RUNNING")
                resumed = True
            except Exception:
                log.warning(f"mlflow: run {self.run_id} is not in {self.uri}; this segment starts a new MLflow run")
        if not resumed:
            cfg = state.config
            try:
                run = self.client.create_run(self.experiment_id, run_name=self.cfg.run_name or cfg.name,
                                             tags={"ecotrain.run_dir": str(self.run_dir.resolve()),
                                                   "ecotrain.name": cfg.name})
            except Exception as exc:
                self.failed = True
                log.warning(f"mlflow: cannot create a run in {self.uri} ({type(exc).__name__}); MLflow tracking is "
                            "off for this run (metrics.jsonl is complete)")
                return
            self.run_id = run.info.run_id
            params = [Param(k, str(v)[:6000]) for k, v in flatten(cfg.to_dict()).items()]
            self._call(lambda: [self.client.log_batch(self.run_id, params=p) for p in _chunks(params, 100)])

        write_json(RunFiles(self.run_dir).mlflow, {"tracking_uri": self.uri, "experiment_id": self.experiment_id,
                                                  "run_id": self.run_id})

    def _call(self, fn) -> None:
        if self.failed or self.run_id is None:
            return
        try:
            fn()
        except Exception as exc:
            self.failed = True
            log.warning(f"mlflow: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}; "
                        "MLflow tracking stops for the rest of this run (metrics.jsonl is complete)")

    def _add(self, record: dict) -> None:
        from mlflow.entities import Metric

        ms, step = int(time.time() * 1000), int(record.get("step", 0))
        self._buffer += [Metric(k, v, ms, step) for k, v in numeric(record).items()]
        if len(self._buffer) >= FLUSH_EVERY:
            self.flush()

    def flush(self) -> None:
        points, self._buffer = self._buffer, []
        if points:
            self._call(lambda: [self.client.log_batch(self.run_id, metrics=c) for c in _chunks(points, BATCH)])

    def on_log(self, state, record):
        self._add(record)

    def on_eval_end(self, state, record):
        self._add(record)
        self.flush()

    def on_fit_end(self, state):
        self.flush()
        stopped = state.stopped_because or ""
        self._call(lambda: self.client.set_tag(self.run_id, "ecotrain.stopped_because", stopped))
        # FINISHED now; run_finished adds the results and moves the end time once finish has written them
        self._call(lambda: self.client.set_terminated(self.run_id, "KILLED" if stopped == "preempted" else "FINISHED"))

    def on_exception(self, state, exc):
        self.flush()
        self._call(lambda: self.client.set_terminated(self.run_id, "FAILED"))

    def run_finished(self, run_dir: Path, summary: dict) -> None:
        from mlflow.entities import Metric, RunTag

        run_dir = Path(run_dir)
        ms, step = int(time.time() * 1000), int(summary.get("steps", 0))
        metrics = [Metric(f"final.{k}", v, ms, step) for k, v in numeric(summary).items()]
        tags = {"ecotrain.dataset_hash": summary.get("dataset_hash"), "ecotrain.stopped_because":
                summary.get("stopped_because")}
        ledger = _read(RunFiles(run_dir).ledger)
        if ledger:
            for name, value in (("flops", (ledger.get("flops") or {}).get("total")),
                                ("wall_seconds", ledger.get("wall_seconds")), ("cpu_seconds", ledger.get("cpu_seconds")),
                                ("energy_kwh", ledger["energy"].get("kwh")), ("co2e_kg", ledger["co2e"].get("kg")),
                                ("cost", ledger["cost"].get("amount"))):
                if isinstance(value, (int, float)):
                    metrics.append(Metric(f"ledger.{name}", float(value), ms, step))
            tags["ecotrain.energy_method"] = ledger["energy"].get("method") or "n/a"
        env = _read(RunFiles(run_dir).environment) or {}
        git = env.get("git") or {}
        if git.get("commit"):
            tags["mlflow.source.git.commit"] = git["commit"]
            tags["ecotrain.git_dirty"] = str(git.get("dirty"))
        tag_list = [RunTag(k, str(v)) for k, v in tags.items() if v is not None]
        self._call(lambda: self.client.log_batch(self.run_id, metrics=metrics, tags=tag_list))
        if self.cfg.artifacts:
            self._call(lambda: self._upload(run_dir))
        self._call(lambda: self.client.set_terminated(self.run_id, "FINISHED"))

    def _upload(self, run_dir: Path) -> None:
        for p in sorted(run_dir.iterdir()):
            if p.name.startswith("."):
                continue
            if p.is_file():
                self.client.log_artifact(self.run_id, str(p))
            elif p.is_dir() and (p.name != CHECKPOINTS or self.cfg.checkpoints):
                self.client.log_artifacts(self.run_id, str(p), p.name)

    # -- checkpoints -----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"run_id": self.run_id}

    def load_state_dict(self, sd: dict) -> None:
        self.run_id = sd.get("run_id")


def _read(path: Path) -> Optional[dict]:
    try:
        obj = safefile.read_json(path, "MLflow state", 64 * safefile.MiB)
    except (OSError, ValueError, ConfigError):
        return None
    return obj if isinstance(obj, dict) else None


def register_champion(run_dir, name: str, tracking_uri: Optional[str] = None, alias: str = "champion",
                      artifact: str = MODEL) -> int:
    """Register a run's model as a new version of `name` in MLflow's model registry and move `alias`
    (MLflow's alias convention: `models:/<name>@champion`) to it. The run folder must have been
    tracked by MLflow (RUN/mlflow.json) with artifacts on. The registry needs a database store
    (sqlite). Called when a registry promotes a version; returns the MLflow version number."""
    from mlflow.tracking import MlflowClient

    info = _read(RunFiles(run_dir).mlflow)
    if not info or not info.get("run_id"):
        raise ConfigError(f"{run_dir}: no {MLFLOW}; the run was not tracked with tracking.mlflow")
    uri = tracking_uri or info["tracking_uri"]
    if uri.startswith("file:") or "://" not in uri:
        raise ConfigError(f"register_champion: MLflow's model registry needs a database store, not {uri} "
                          "(use tracking.mlflow.tracking_uri=sqlite:///mlflow.db)")
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    try:
        client.get_registered_model(name)
    except Exception:
        client.create_registered_model(name)
    run = client.get_run(info["run_id"])
    source = f"{run.info.artifact_uri.rstrip('/')}/{artifact}"
    version = client.create_model_version(name, source, run_id=info["run_id"],
                                          tags={"ecotrain.run_dir": str(Path(run_dir).resolve())})
    client.set_registered_model_alias(name, alias, version.version)
    return int(version.version)
