"""The model registry: a local folder of versions, a `current` pointer, and the lock that guards them.

    REGISTRY/
      registry.lock           fcntl.flock'ed by every writer (`Registry.locked()`)
      index.json              status of each version (candidate | promoted | rejected | rolled_back, with
                              the reason), `current` (the base everyone is served by), `cohorts` ({cohort:
                              the version serving it}: per-cohort adapters, each promoted and rolled back
                              on its own), and the promotion history; written atomically
      versions/v0001/         one checkpoint folder per version (checkpoint/format.py: safetensors + JSON +
                              MANIFEST.json with checksums, written to a temporary folder and renamed):
                                tensors.safetensors   model/<name>: full weights (absent for adapter-only)
                                meta.json             config, model shape, data hashes, slices, metrics,
                                                      parent, gate decision
                                export.safetensors    the run's `export` (replay buffer, Fisher), if any
                                adapter/              PEFT adapter (adapter_model.safetensors + config)
      data/<name>-<hash>/     evaluation slices (x, y[, cohort]) as checkpoint folders, content-addressed

A version folder is immutable once written; only index.json changes (promote, reject, rollback).
Reading a version verifies its manifest and checksums first, so a truncated or bit-flipped file is
one CheckpointError line. Version names are `v` + digits: never a path.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

from ecotrain.base import safefile
from ecotrain.continual.lock import LOCK_TIMEOUT, registry_lock
from ecotrain.checkpoint.format import flatten, read_checkpoint, unflatten, verify_checkpoint, write_checkpoint
from ecotrain.base.errors import CheckpointError, ConfigError
from ecotrain.base.jsonfile import check_fields, read_json
from ecotrain.base.rundir import write_json

INDEX_FORMAT = "ecotrain-registry/1"
VERSION_RE = re.compile(r"v\d{1,9}")
SLICE_RE = re.compile(r"[\w.+-]{1,64}")
STATUSES = ("candidate", "promoted", "rejected", "rolled_back")
DEFAULT_REGISTRY = "registry"
INDEX_FIX = "restore it from a backup (each version's own files are in versions/)"
# what the commands read of index.json (format, history and the names' cross-references are checked apart)
INDEX_FIELDS = {"versions": dict, "versions.*": dict, "current": (str, None), "cohorts": dict, "cohorts.*": str,
                "history": list, "history.*": dict, "history.*.current": (str, None)}
# a version's meta.json: checksummed, so a mismatch is another version's format, not damage
META_FIELDS = {"config?": dict, "input_shape?": list, "input_shape.*?": int, "num_classes?": (int, None),
               "classes_seen?": list, "slices?": list, "slices.*?": str, "parent?": (str, None), "weights?": str}


def check_version_name(name: str) -> str:
    if not isinstance(name, str) or not VERSION_RE.fullmatch(name):
        raise ConfigError(f"version '{name}': not a version name; use one like v0003 (see `ecotrain versions`) "
                          "or `current`")
    return name


@dataclass
class Slice:
    """An evaluation slice (a task's test data): x, y and an optional cohort per example."""

    name: str
    x: torch.Tensor
    y: torch.Tensor
    cohort: Optional[torch.Tensor] = None

    def digest(self) -> str:
        h = hashlib.sha256()
        for t in (self.x, self.y, self.cohort):
            if t is not None:
                h.update(str((t.dtype, tuple(t.shape))).encode())
                h.update(t.contiguous().numpy().tobytes())
        return h.hexdigest()[:16]


class Registry:
    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.versions_dir = self.root / "versions"
        self.data_dir = self.root / "data"
        self.index_path = self.root / "index.json"

    @property
    def where(self) -> str:
        """How messages name the registry: its folder (an MLflow registry names its URI)."""
        return str(self.root)

    # -- the lock ----------------------------------------------------------------------------------
    def locked(self, timeout: float = LOCK_TIMEOUT):
        """Exclusive access for one writer (lock.py); another process waits up to `timeout` s."""
        return registry_lock(self.root, timeout)

    # -- the index ---------------------------------------------------------------------------------
    def index(self) -> dict:
        if not self.index_path.is_file():
            if self.root.exists() and not self.root.is_dir():
                raise ConfigError(f"--registry {self.where}: is a file, not a registry folder")
            return {"format": INDEX_FORMAT, "current": None, "cohorts": {}, "versions": {}, "history": []}
        path = self.index_path
        idx = read_json(path, "registry index", {"format": (str, None)}, INDEX_FIX, CheckpointError)
        if idx["format"] != INDEX_FORMAT:
            raise CheckpointError(f"{path}: not an ecotrain registry index ({INDEX_FORMAT}); {INDEX_FIX}")
        if "history" not in idx:
            raise CheckpointError(f"{path}: the registry index has no 'history' (the record of promotions rollback "
                                  'reads); add "history": [] to it (rollback then has nothing earlier to go back '
                                  "to), or restore it from a backup")
        idx.setdefault("cohorts", {})  # an index written before per-cohort versions
        check_fields(idx, INDEX_FIELDS, path, "registry index", INDEX_FIX, CheckpointError)
        known = idx["versions"]
        odd = next((n for n in known if not VERSION_RE.fullmatch(n)), None)
        if odd is not None:
            raise CheckpointError(f"{path}: the registry index lists '{odd}', not a version name (v0001, ...); "
                                  f"remove that entry, or restore it from a backup")
        for field, name in [("current", idx["current"]), *((f"cohorts.{c}", v) for c, v in idx["cohorts"].items())]:
            if name is not None and name not in known:
                raise CheckpointError(f"{path}: the registry index's '{field}' names {name}, which is not among its "
                                      f"versions ({', '.join(sorted(known)) or 'none'}); set it to one of them (or "
                                      f"null) in {path.name}, or restore it from a backup")
        return idx

    def existing_index(self) -> dict:
        """The index of a registry that must already exist (resolving, promoting, rolling back)."""
        if not self.index_path.is_file():
            raise ConfigError(f"{self.where}: no registry here (no index.json); register a finished run first: "
                              f"`ecotrain versions add RUN --registry {self.where}`")
        return self.index()

    def write_index(self, idx: dict) -> None:
        """Call under `locked()`. Atomic: a failed write (a full or read-only disk) leaves the old index."""
        try:
            write_json(self.index_path, idx)
        except OSError as exc:
            raise CheckpointError(f"{self.index_path}: could not be written ({exc.strerror or exc}); the registry "
                                  "is unchanged: free the disk, then run the command again") from None

    def resolve(self, name: str) -> str:
        """A version name, or `current`, to an existing version's name."""
        if name != "current":
            check_version_name(name)
        idx = self.existing_index()
        if name == "current":
            if not idx["current"]:
                raise ConfigError(f"{self.where}: no current version; register one with "
                                  f"`ecotrain versions add RUN --registry {self.where}`")
            return idx["current"]
        if name not in idx["versions"]:
            known = ", ".join(sorted(idx["versions"])) or "none"
            raise ConfigError(f"{self.where}: no version {name} (versions: {known})")
        return name

    def next_name(self, idx: dict) -> str:
        nums = [int(v[1:]) for v in idx["versions"]]
        nums += [int(p.name[1:]) for p in self.versions_dir.glob("v*") if VERSION_RE.fullmatch(p.name)]
        return f"v{max(nums, default=0) + 1:04d}"

    def set_status(self, idx: dict, name: str, status: str, reason: str) -> None:
        assert status in STATUSES
        idx["versions"][name].update(status=status, reason=reason, updated=now())

    def make_current(self, idx: dict, name: str, reason: str) -> None:
        """Promote `name`: it becomes `current`, or, for a cohort's version, what serves that cohort."""
        self.set_status(idx, name, "promoted", reason)
        cohort = idx["versions"][name].get("cohort")
        if cohort is None:
            idx["current"] = name
            idx["history"].append({"current": name, "time": now(), "reason": reason})
        else:
            idx.setdefault("cohorts", {})[cohort] = name
            idx["history"].append({"cohort": cohort, "current": name, "time": now(), "reason": reason})

    # -- versions ----------------------------------------------------------------------------------
    def path(self, name: str) -> Path:
        return self.versions_dir / check_version_name(name)

    def write_version(self, name: str, weights: Optional[dict], meta: dict, files: dict[str, Path]) -> Path:
        """Atomically create versions/<name>: `weights` (a state_dict, or None for an adapter-only version),
        `meta`, and `files` {name in the folder: source path} copied in, all under one manifest."""
        folder = self.path(name)
        if folder.exists():
            raise CheckpointError(f"{folder}: already exists; versions are never overwritten")
        self.versions_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.versions_dir / f".tmp-{name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        for rel, src in files.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, tmp / rel)
        tensors: dict = {}
        skeleton = flatten({"model": weights} if weights is not None else {}, tensors)
        return write_checkpoint(folder, tensors, {**meta, **skeleton}, extra_files=sorted(files), staged=tmp)

    def commit(self, weights: Optional[dict], meta: dict, files: dict[str, Path], slices: list[Slice],
               settle: Callable[[dict, str], None]) -> str:
        """Under the lock: store the slices (their ids in meta["slices"]), take the next name, write the
        version folder, add it to the index and let `settle(index, name)` set its status; the index is
        written last, so a crash before it leaves an unlisted folder, never a listed broken one."""
        with self.locked():
            meta["slices"] = [self.put_slice(s) for s in slices]
            idx = self.index()
            name = self.next_name(idx)
            self.write_version(name, weights, meta, files)
            idx["versions"][name] = {"parent": meta.get("parent"), "created": meta.get("created", now()),
                                     "weights": meta.get("weights", "full")}
            if meta.get("cohort") is not None:  # a cohort's own version: promoted and rolled back on its own
                idx["versions"][name]["cohort"] = str(meta["cohort"])
            gate = (meta.get("metrics") or {}).get("gate")
            if gate:  # the gate's decision and figures, beside the status they explain
                idx["versions"][name]["gate"] = gate
            settle(idx, name)
            self.write_index(idx)
        return name

    def read_meta(self, name: str) -> dict:
        """A version's meta.json, after verifying the whole folder (manifest, checksums, headers)."""
        folder = self.path(name)
        verify_checkpoint(folder)
        return read_json(folder / "meta.json", f"version {name}'s record", META_FIELDS,
                         "written by another ecotrain version? register the run again", CheckpointError)

    def weights(self, name: str) -> Optional[dict]:
        tensors, meta = read_checkpoint(self.path(name))
        return unflatten(meta, tensors).get("model")

    # -- evaluation slices -------------------------------------------------------------------------
    def put_slice(self, s: Slice) -> str:
        """Store a slice once (content-addressed); returns its id `<name>-<hash>`."""
        if not SLICE_RE.fullmatch(s.name):
            raise ConfigError(f"slice name '{s.name}': use letters, digits and . _ + - (up to 64)")
        sid = f"{s.name}-{s.digest()}"
        folder = self.data_dir / sid
        if not folder.exists():
            self.data_dir.mkdir(parents=True, exist_ok=True)
            tensors = {"x": s.x.contiguous(), "y": s.y.contiguous()}
            if s.cohort is not None:
                tensors["cohort"] = s.cohort.contiguous()
            write_checkpoint(folder, tensors, {"name": s.name, "samples": len(s.y)})
        return sid

    def get_slice(self, sid: str) -> Slice:
        if not SLICE_RE.fullmatch(sid) or sid.startswith("."):
            raise CheckpointError(f"{self.where}: slice id '{sid}' in a version's meta.json is not valid")
        tensors, meta = read_checkpoint(self.data_dir / sid)
        s = Slice(meta["name"], tensors["x"], tensors["y"], tensors.get("cohort"))
        if f"{s.name}-{s.digest()}" != sid:
            raise CheckpointError(f"{self.data_dir / sid}: content does not match its name (hash); the slice is damaged")
        return s


def promote(reg: Registry, name: str) -> str:
    """Make a version `current` by hand (a rejected one too: the gate's reason is kept in the message)."""
    reg.resolve(name)  # before the lock: a folder holding no registry stays untouched
    with reg.locked():
        idx = reg.index()
        name = reg.resolve(name)
        reg.read_meta(name)  # never point `current` at a damaged version
        was = idx["versions"][name]
        why = f"promoted by hand (was {was.get('status')}: {was.get('reason', '')})"
        reg.make_current(idx, name, why)
        reg.write_index(idx)
    return f"{name} is now current ({why})"


def rollback(reg: Registry, cohort: Optional[str] = None) -> str:
    """`current` (or, with `cohort`, the version serving that cohort) back to the one promoted before it;
    the version rolled back from is kept, marked rolled_back. A cohort whose first version is rolled
    back is served by the base again."""
    reg.existing_index()
    with reg.locked():
        idx = reg.index()
        cur = idx["current"] if cohort is None else idx["cohorts"].get(cohort)
        what = "current" if cohort is None else f"cohort {cohort}"
        if cur is None:
            raise ConfigError(f"{reg.where}: no version serves {what}, so nothing to roll back"
                              + (f" (cohorts: {', '.join(sorted(idx['cohorts'])) or 'none'})" if cohort else ""))
        target = next((h["current"] for h in reversed(idx["history"]) if h.get("cohort") == cohort
                       and h["current"] != cur and idx["versions"].get(h["current"], {}).get("status") == "promoted"),
                      None)
        if target is None and cohort is None:
            raise ConfigError(f"{reg.where}: {cur} is the only version ever promoted; nothing to roll back to")
        if target is not None:
            reg.read_meta(target)  # verified before it serves
        reg.set_status(idx, cur, "rolled_back", f"rolled back to {target or 'the base'}")
        if cohort is None:
            idx["current"] = target
        elif target is None:
            del idx["cohorts"][cohort]
        else:
            idx["cohorts"][cohort] = target
        idx["history"].append({**({"cohort": cohort} if cohort else {}), "current": target, "time": now(),
                               "reason": f"rollback from {cur}"})
        reg.write_index(idx)
    if cohort is None:
        return f"rolled back: current is {target} (was {cur})"
    return f"rolled back cohort {cohort}: served by {target or 'the base (current)'} (was {cur})"


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def file_hash(path: Path) -> str:
    h = hashlib.sha256()
    with safefile.open_regular(path, "file to hash") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def format_table(idx: dict) -> str:
    """`ecotrain versions`: one row per version."""
    rows = [("  version", "status", "parent", "weights", "created", "reason")]
    serving = set(idx.get("cohorts", {}).values()) | {idx["current"]}
    for name in sorted(idx["versions"]):
        v = idx["versions"][name]
        mark = "* " if name in serving else "  "
        weights = v.get("weights", "full") + (f" ({v['cohort']})" if v.get("cohort") is not None else "")
        rows.append((mark + name, v.get("status", "?"), v.get("parent") or "-", weights,
                     v.get("created", "?"), v.get("reason", "")))
    if len(rows) == 1:
        return "no versions yet"
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[5] for r in rows]
    return "\n".join(lines) + "\n(* serving: current, or the version of the cohort in brackets)"
