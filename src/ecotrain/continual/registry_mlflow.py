"""The registry on MLflow's Model Registry: `--registry mlflow:URI[#MODEL]` (docs/updates.md "Registry on MLflow").

The same interface and semantics as the folder registry (registry.py, subclassed here): update,
promote and rollback run unchanged, since only where each piece lives differs. One registry, not two
side by side: with `mlflow:` nothing is written to a registry folder.

  version vNNNN         model version NNNN of the registered model MODEL (default `ecotrain`); its
                        folder (checkpoint/format.py, byte for byte what a folder registry holds) is the
                        `version/` artifacts of one MLflow run, and the version's `source`
  its index entry       model-version tags `ecotrain.<key>` (status, reason, parent, created, weights and
                        any other key); `ecotrain_keys` lists the keys, which of them are JSON-encoded
                        (strings are stored as they are), and marks the version as listed
  current               the alias `champion`; the newest candidate holds `challenger`
  history, other keys   registered-model tags `ecotrain.history` (the last HISTORY_KEEP entries) and
                        `ecotrain.index.<key>` (JSON), e.g. `cohorts`
  gate figures          model-version tags `gate.<key>` and `accuracy.<slice>` (`perplexity.<slice>`); the version run's metrics
  evaluation slices     `data/<id>/` artifacts of one run per registered model (`ecotrain.slices_run`),
                        content-addressed like the folder registry's data/

Reading downloads into a local cache (data/cache.py's folder: `mlflow/<hash of URI#MODEL>/`), keyed
by the version's run id so a recreated store never serves stale files, and verifies the manifest and
checksums before anything is used. A cached copy that fails verification is dropped and fetched
again once; a damaged copy in the store is one CheckpointError line.

The lock is registry_lock (lock.py) in the sqlite database's folder, else in the cache folder (then it
serialises the writers of this machine only). MLflow has no transactions: the new version's tags are
written before its `ecotrain_keys` marker, so a writer killed midway leaves an unlisted version.

MLflow is an optional extra, imported only when an `mlflow:` registry is opened.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import re
import shutil
from pathlib import Path
from typing import Optional

from ecotrain.checkpoint.format import verify_checkpoint
from ecotrain.continual.lock import LOCK_TIMEOUT, registry_lock
from ecotrain.continual.registry import INDEX_FORMAT, SLICE_RE, Registry, Slice, check_version_name
from ecotrain.base.cachedir import cache_dir
from ecotrain.base.errors import CheckpointError, ConfigError, EcotrainError
from ecotrain.base.log import log
from ecotrain.tracking import EXTRAS, flatten, numeric
from ecotrain.tracking.mlflow_tracker import experiment_id

PREFIX = "mlflow:"
DEFAULT_MODEL = "ecotrain"
EXPERIMENT = "ecotrain-registry"  # the experiment holding the versions' and slices' runs
CHAMPION, CHALLENGER = "champion", "challenger"
HISTORY_KEEP = 200  # promotions kept in the `ecotrain.history` tag (rollback reads the newest)
TAG = "ecotrain."  # an index entry's keys, on the model version; the index's own keys, on the model
KEYS_TAG = "ecotrain_keys"  # {key: "str" | "json"}; present = the version is listed in the index
HISTORY_TAG, FORMAT_TAG, SLICES_TAG = "ecotrain.history", "ecotrain.format", "ecotrain.slices_run"
INDEX_TAG = "ecotrain.index."
OWN_KEYS = ("format", "current", "versions", "history")  # the index keys stored in their own places
TAG_VALUE_MAX = 100_000  # MLflow's limit for a model-registry tag value
MODEL_RE = re.compile(r"[\w.\- ]{1,200}")


def open_registry(spec: str | Path) -> Registry:
    """The registry `--registry` names: `mlflow:URI[#MODEL]` for MLflow's Model Registry, else a folder."""
    if isinstance(spec, str) and spec.startswith(PREFIX):
        return MlflowRegistry(spec)
    if not str(spec).strip():  # Path("") is the current folder: it would be made a registry, unasked
        raise ConfigError("--registry is empty; give a registry folder (default ./registry; . for this one) or "
                          "mlflow:TRACKING_URI")
    return Registry(spec)


def parse_spec(spec: str) -> tuple[str, str]:
    """`mlflow:URI[#MODEL]` -> (URI, MODEL); a relative sqlite path is made absolute (as the tracker's)."""
    rest = spec[len(PREFIX):]
    uri, sep, model = rest.rpartition("#") if "#" in rest else (rest, "", DEFAULT_MODEL)
    if not uri:
        raise ConfigError(f"registry {spec}: give the tracking URI after `mlflow:`, e.g. "
                          "mlflow:sqlite:////abs/path/mlflow.db (optionally #MODEL_NAME)")
    if not MODEL_RE.fullmatch(model):
        raise ConfigError(f"registry {spec}: '{model}' is not a registered model name (letters, digits, "
                          "space and . _ -)")
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////") and ":memory:" not in uri:
        uri = f"sqlite:///{Path(uri.removeprefix('sqlite:///')).resolve()}"
    return uri, model


def _sqlite_file(uri: str) -> Optional[Path]:
    if uri.startswith("sqlite:////"):
        return Path(uri.removeprefix("sqlite:///").split("?")[0])
    return None


def _name(version) -> str:
    return f"v{int(version):04d}"


def _safe(name: str) -> str:
    """A metric or tag name MLflow accepts (a slice name may hold `+`)."""
    return re.sub(r"[^\w.\- /]", "_", name)


def _why(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


def encode_entry(entry: dict) -> dict[str, str]:
    """An index entry as model-version tags: strings as they are, anything else as JSON; the
    `ecotrain_keys` marker last (it lists the version)."""
    tags, kinds = {}, {}
    for key, value in entry.items():
        kinds[key] = "str" if isinstance(value, str) else "json"
        tags[TAG + key] = value if isinstance(value, str) else json.dumps(value)
    tags[KEYS_TAG] = json.dumps(kinds)
    return tags


def decode_entry(tags: dict[str, str]) -> Optional[dict]:
    """The index entry held in a model version's tags; None for a version that is not listed."""
    if KEYS_TAG not in tags:
        return None
    kinds = json.loads(tags[KEYS_TAG])
    return {k: tags.get(TAG + k) if kind == "str" else json.loads(tags.get(TAG + k, "null"))
            for k, kind in kinds.items()}


def figure_tags(meta: dict) -> dict[str, str]:
    """The gate's decision and figures, readable in the MLflow UI: `gate.<key>`, `accuracy.<slice>`."""
    metrics = meta.get("metrics") or {}
    tags = {_safe(f"gate.{k}"): str(v) if isinstance(v, str) else json.dumps(v)
            for k, v in (metrics.get("gate") or {}).items()}
    figure = "perplexity" if meta.get("task") == "language_model" else "accuracy"  # assembly/update_lm.py
    for task, acc in (metrics.get("tasks") or {}).items():
        tags[_safe(f"{figure}.{task}")] = f"{acc:.4f}"
    for key in ("average_accuracy", "average_forgetting", "average_perplexity", "forgetting_ppl_ratio"):
        if isinstance(metrics.get(key), (int, float)):
            tags[key] = f"{metrics[key]:.4f}"
    return tags


@contextlib.contextmanager
def _env_defaults(**values: str):
    """MLflow settings for one call, each only where the user has not set it."""
    mine = {k: v for k, v in values.items() if k not in os.environ}
    os.environ.update(mine)
    try:
        yield
    finally:
        for k in mine:
            os.environ.pop(k, None)


QUIET_DOWNLOADS = {"MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}  # no progress bar per download
FAST_PROBE = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}  # a dead server: one
# line at once, not after MLflow's minutes of retries


class MlflowRegistry(Registry):
    """The registry of registry.py, kept in MLflow's Model Registry (module docstring); `root` is the
    local cache of downloaded versions and slices (and `work/`, where update trains)."""

    def __init__(self, spec: str):
        self.spec = spec
        self.uri, self.model = parse_spec(spec)
        module, _, install = EXTRAS["mlflow"]
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise ConfigError(f"registry {spec}: needs the mlflow extra: {install}")
        key = hashlib.sha256(f"{self.uri}#{self.model}".encode()).hexdigest()[:16]
        root = cache_dir()
        if root is None:  # no home folder (base/cachedir.py): downloads need a folder that outlives the command
            raise ConfigError(f"registry {spec}: no home folder for its download cache; set ECOTRAIN_CACHE "
                              "to a writable folder")
        super().__init__(root / "mlflow" / key)
        self.db = _sqlite_file(self.uri)
        self._client = None
        self._fresh: set[Path] = set()  # folders this process downloaded (verified then)

    @property
    def where(self) -> str:
        """How messages name this registry (the folder registry's messages name its folder)."""
        return self.spec

    # -- the store -----------------------------------------------------------------------------------
    def _exists(self) -> bool:
        """False for a sqlite database not there yet: reading never creates one."""
        return self.db is None or self.db.is_file()

    def client(self):
        if self._client is None:
            from mlflow.tracking import MlflowClient  # the optional extra: only for an mlflow: registry

            try:
                client = MlflowClient(tracking_uri=self.uri, registry_uri=self.uri)
                with _env_defaults(**FAST_PROBE):
                    client.search_registered_models(max_results=1)  # a bad URI or a dead server fails here
            except Exception as exc:
                raise ConfigError(f"{self.where}: cannot open the MLflow store ({_why(exc)})") from None
            self._client = client
        return self._client

    @contextlib.contextmanager
    def _store(self, what: str):
        """Any MLflow failure mid-operation as one line (connects only when the block does)."""
        try:
            yield
        except EcotrainError:
            raise
        except Exception as exc:
            raise ConfigError(f"{self.where}: {what} failed ({_why(exc)})") from None

    def _registered(self):
        """The registered model, or None."""
        from mlflow.exceptions import MlflowException

        try:
            return self.client().get_registered_model(self.model)
        except MlflowException as exc:
            if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
                return None
            raise

    def _model_versions(self) -> list:
        out, token = [], None
        while True:
            page = self.client().search_model_versions(f"name='{self.model}'", page_token=token)
            out += list(page)
            token = page.token
            if not token:
                return out

    def _version(self, name: str):
        """The MLflow model version of `name`, or None."""
        from mlflow.exceptions import MlflowException

        if not self._exists():
            return None
        try:
            return self.client().get_model_version(self.model, str(int(name[1:])))
        except MlflowException as exc:
            if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
                return None
            raise

    def _experiment(self) -> str:
        return experiment_id(self.client(), self.uri, EXPERIMENT)

    def _ensure_model(self):
        rm = self._registered()
        if rm is None:
            self.client().create_registered_model(self.model, tags={FORMAT_TAG: INDEX_FORMAT},
                                                  description="ecotrain registry (docs/updates.md)")
            rm = self._registered()
        return rm

    # -- the lock and the index ----------------------------------------------------------------------
    def locked(self, timeout: float = LOCK_TIMEOUT):
        return registry_lock(self.db.parent if self.db is not None else self.root, timeout)

    def index(self) -> dict:
        idx = super().index()  # the folder registry's empty index, its default keys: the cache holds no index.json
        if not self._exists():
            return idx
        with self._store("reading the registry"):
            rm = self._registered()
            if rm is None:
                return idx
            tags = rm.tags or {}
            if tags.get(FORMAT_TAG, INDEX_FORMAT) != INDEX_FORMAT:
                raise CheckpointError(f"{self.where}: registered model '{self.model}' holds format "
                                      f"{tags[FORMAT_TAG]!r}, not {INDEX_FORMAT}")
            try:
                for mv in self._model_versions():
                    entry = decode_entry(mv.tags or {})
                    if entry is not None:
                        idx["versions"][_name(mv.version)] = entry
                idx["history"] = json.loads(tags.get(HISTORY_TAG, "[]"))
                idx.update({k[len(INDEX_TAG):]: json.loads(v) for k, v in tags.items() if k.startswith(INDEX_TAG)})
            except ValueError as exc:
                raise CheckpointError(f"{self.where}: an ecotrain tag holds invalid JSON ({exc}); the registry "
                                      "index is damaged") from None
            champion = (rm.aliases or {}).get(CHAMPION)
            if champion is not None and _name(champion) in idx["versions"]:
                idx["current"] = _name(champion)
        return idx

    def existing_index(self) -> dict:
        with self._store("reading the registry"):
            missing = not self._exists() or self._registered() is None
        if missing:
            raise ConfigError(f"{self.where}: no registry here (no registered model '{self.model}'); register a "
                              f"finished run first: `ecotrain versions add RUN --registry {self.spec}`")
        return self.index()

    def write_index(self, idx: dict) -> None:
        """Call under `locked()`: the index's changes as tags and aliases (only what changed is written)."""
        with self._store("writing the registry index"):
            c = self.client()
            rm = self._ensure_model()
            have = {_name(mv.version): mv for mv in self._model_versions()}
            for name, entry in idx["versions"].items():
                if name not in have:
                    raise CheckpointError(f"{self.where}: {name} is listed but is no version of '{self.model}'")
                self._sync_tags(have[name], encode_entry(entry))
            for name in have.keys() - idx["versions"].keys():  # dropped from the index: unlisted
                self._sync_tags(have[name], {})
            model_tags = {FORMAT_TAG: INDEX_FORMAT, HISTORY_TAG: _bounded_history(idx["history"])}
            model_tags.update({INDEX_TAG + k: json.dumps(v) for k, v in idx.items() if k not in OWN_KEYS})
            old = rm.tags or {}
            for k, v in model_tags.items():
                if old.get(k) != v:
                    c.set_registered_model_tag(self.model, k, v)
            for k in old:
                if k.startswith(INDEX_TAG) and k not in model_tags:
                    c.delete_registered_model_tag(self.model, k)
            candidates = [n for n, e in idx["versions"].items() if e.get("status") == "candidate"]
            aliases = {CHAMPION: idx["current"], CHALLENGER: max(candidates, default=None)}
            for alias, name in aliases.items():
                now = (rm.aliases or {}).get(alias)
                if name is None and now is not None:
                    c.delete_registered_model_alias(self.model, alias)
                elif name is not None and (now is None or _name(now) != name):
                    c.set_registered_model_alias(self.model, alias, str(int(name[1:])))

    def _sync_tags(self, mv, want: dict[str, str]) -> None:
        c, old = self.client(), {k: v for k, v in (mv.tags or {}).items() if k.startswith(TAG) or k == KEYS_TAG}
        if not want and KEYS_TAG in old:  # unlisting: the marker goes first
            c.delete_model_version_tag(self.model, mv.version, KEYS_TAG)
        for k, v in want.items():  # encode_entry puts the marker last
            if old.get(k) != v:
                c.set_model_version_tag(self.model, mv.version, k, v)
        for k in old.keys() - want.keys() - {KEYS_TAG}:
            c.delete_model_version_tag(self.model, mv.version, k)

    def next_name(self, idx: dict) -> str:
        nums = [int(v[1:]) for v in idx["versions"]]
        with self._store("numbering the new version"):
            if self._exists() and self._registered() is not None:  # unlisted ones too: MLflow never reuses one
                nums += [int(mv.version) for mv in self._model_versions()]
        return _name(max(nums, default=0) + 1)

    # -- versions ------------------------------------------------------------------------------------
    def path(self, name: str) -> Path:
        """The version's verified local copy (downloaded once); for a name MLflow has not numbered yet,
        the folder where write_version stages it."""
        check_version_name(name)
        with self._store(f"reading {name}"):
            mv = self._version(name)
            return self.versions_dir / name if mv is None else self._fetch_version(name, mv)

    def _fetch_version(self, name: str, mv) -> Path:
        folder = self.versions_dir / f"{name}-{mv.run_id}"
        if not folder.is_dir():
            self._download(mv.source, folder, f"{name} ({mv.source})")
        return folder

    def _download(self, uri: str, folder: Path, what: str) -> None:
        """`uri`'s artifacts into `folder`, verified first (checkpoint/format.py), then renamed in place."""
        import mlflow.artifacts

        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = folder.parent / f".fetch-{folder.name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            with _env_defaults(**QUIET_DOWNLOADS):
                got = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(tmp),
                                                               tracking_uri=self.uri))
            try:
                verify_checkpoint(got)
            except CheckpointError as exc:
                raise CheckpointError(f"{self.where}: {what} is damaged in the store: "
                                      f"{str(exc).replace(str(got), 'its artifacts')}") from None
            if not folder.exists():  # else another process fetched it meanwhile: the same verified bytes
                got.rename(folder)
            self._fresh.add(folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _healing(self, read, arg, folder_of):
        """`read(arg)`; a cached copy that fails verification (a disk fault) is dropped and fetched once more."""
        try:
            return read(arg)
        except CheckpointError as exc:
            folder = folder_of(arg)
            if folder in self._fresh or not folder.is_dir() or not folder.is_relative_to(self.root):
                raise
            log.warning(f"{self.where}: the cached copy {folder} failed verification ({exc}); fetching it again")
            shutil.rmtree(folder)
            return read(arg)

    def read_meta(self, name: str) -> dict:
        return self._healing(super().read_meta, name, self.path)

    def weights(self, name: str) -> Optional[dict]:
        return self._healing(super().weights, name, self.path)

    def write_version(self, name: str, weights: Optional[dict], meta: dict, files: dict[str, Path]) -> Path:
        """The folder registry's version folder, staged in the cache, logged as one MLflow run's `version/`
        artifacts and registered as model version `name` (the gate's figures as its tags)."""
        staged = self.versions_dir / name
        shutil.rmtree(staged, ignore_errors=True)  # left by a writer killed before the upload (we hold the lock)
        super().write_version(name, weights, meta, files)
        with self._store(f"registering {name}"):
            c = self.client()
            self._ensure_model()
            run = c.create_run(self._experiment(), run_name=f"{self.model} {name}",
                               tags={"ecotrain.version": name, "ecotrain.registered_model": self.model})
            run_id = run.info.run_id
            c.log_artifacts(run_id, str(staged), "version")
            self._log_metrics(run_id, meta)
            c.set_terminated(run_id)
            mv = c.create_model_version(self.model, f"{run.info.artifact_uri.rstrip('/')}/version", run_id=run_id,
                                        tags=figure_tags(meta))
        if _name(mv.version) != name:
            raise CheckpointError(f"{self.where}: MLflow numbered the new version {mv.version}, not {name[1:]}: "
                                  "something registered a version of the model meanwhile without ecotrain's lock; "
                                  "run the command again")
        folder = self.versions_dir / f"{name}-{run_id}"
        staged.rename(folder)  # the cached copy: no download for this process's next read
        return folder

    def _log_metrics(self, run_id: str, meta: dict) -> None:
        import time

        from mlflow.entities import Metric

        ms = int(time.time() * 1000)
        figures = numeric(flatten(meta.get("metrics") or {}))
        points = [Metric(_safe(k), v, ms, 0) for k, v in figures.items()]
        for i in range(0, len(points), 1000):  # log_batch's limit
            self.client().log_batch(run_id, metrics=points[i:i + 1000])

    # -- evaluation slices ---------------------------------------------------------------------------
    def _slices_run(self, create: bool) -> Optional[str]:
        rm = self._ensure_model() if create else self._registered()
        run_id = (rm.tags or {}).get(SLICES_TAG) if rm is not None else None
        if run_id is None and create:
            c = self.client()
            run = c.create_run(self._experiment(), run_name=f"{self.model} slices",
                               tags={"ecotrain.registered_model": self.model, "ecotrain.role": "evaluation slices"})
            run_id = run.info.run_id
            c.set_terminated(run_id)
            c.set_registered_model_tag(self.model, SLICES_TAG, run_id)
        return run_id

    def put_slice(self, s: Slice) -> str:
        """Call under `locked()`: stored once in the store (content-addressed) and in the cache."""
        sid = super().put_slice(s)
        with self._store(f"storing slice {sid}"):
            c = self.client()
            run_id = self._slices_run(create=True)
            if not c.list_artifacts(run_id, f"data/{sid}"):
                verify_checkpoint(self.data_dir / sid)  # never upload a damaged cached copy
                c.log_artifacts(run_id, str(self.data_dir / sid), f"data/{sid}")
        return sid

    def get_slice(self, sid: str) -> Slice:
        return self._healing(self._read_slice, sid, lambda sid: self.data_dir / sid)

    def _read_slice(self, sid: str) -> Slice:
        """Fetched first if not cached; an invalid id gets the folder registry's one line."""
        if SLICE_RE.fullmatch(sid) and not sid.startswith(".") and not (self.data_dir / sid).is_dir():
            with self._store(f"reading slice {sid}"):
                c = self.client()
                run_id = self._slices_run(create=False)
                if run_id is None or not c.list_artifacts(run_id, f"data/{sid}"):
                    raise CheckpointError(f"{self.where}: slice {sid}, named in a version's meta.json, is not in "
                                          "the store")
                self._download(f"runs:/{run_id}/data/{sid}", self.data_dir / sid, f"slice {sid}")
        return super().get_slice(sid)

    # -- messages ------------------------------------------------------------------------------------
    def resolve(self, name: str) -> str:
        try:
            return super().resolve(name)
        except ConfigError as exc:  # the folder registry names its root; this one is the spec
            raise ConfigError(str(exc).replace(str(self.root), self.spec)) from None


def _bounded_history(history: list) -> str:
    """The newest HISTORY_KEEP entries as JSON, fewer if that is too long for a tag."""
    keep = history[-HISTORY_KEEP:]
    text = json.dumps(keep)
    while len(text) > TAG_VALUE_MAX and keep:
        keep = keep[len(keep) // 10 + 1:]
        text = json.dumps(keep)
    return text
