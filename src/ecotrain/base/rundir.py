"""The run folder: what is written into it, and how (its files' names: runfiles.py).

Files that must never be half-written go through `atomic_write`: temp name, fsync, rename.
`RunFolder` is the rule for a whole folder: a folder holding a run is resumed, or refused, or
replaced only under `--overwrite`; nothing is written until the start is accepted, and a start
that fails before training leaves no folder behind (docs/reliability.md)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import yaml

from ecotrain.base import safefile
from ecotrain.base.errors import CheckpointError, ConfigError
from ecotrain.base.filelock import holder, open_lock, try_lock, unlock
from ecotrain.base.runfiles import (CHECKPOINTS, CONFIG, LOCK, MARKS, METRICS, OWN, RUN_FILES,  # noqa: F401 (TOKENIZER:
                               TOKENIZER)  # re-exported for the modules that import it from here)

def default_run_dir(name: str) -> Path:
    return Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def atomic_write(path: Path, data: bytes) -> None:
    """The one way a file is written: to a temporary beside it, flushed, then renamed over it; a failure
    leaves the old file (or none)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    if len(tmp.name.encode()) > 255:  # the temporary's prefix must not be what makes the name too long
        tmp = path.with_name(f".tmp-{os.getpid()}-{abs(hash(path.name)):x}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:  # a full disk, a folder in the way: no half-written file left behind
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        if isinstance(exc, OSError) and exc.errno is not None:  # named by the file asked for, not the temporary
            raise type(exc)(exc.errno, exc.strerror, str(path)) from None
        raise  # said in one line by the caller or the CLI's boundary (errors.os_error_line)
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: Path, obj) -> None:
    atomic_write(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def config_yaml(config_dict: dict) -> str:
    """A run's config as the YAML of config.yaml (and of `ecotrain fit --print-config`), in schema order."""
    return yaml.safe_dump(config_dict, sort_keys=False)


def write_config(run_dir: Path, config_dict: dict) -> None:
    atomic_write(Path(run_dir) / CONFIG, config_yaml(config_dict).encode())


def file_in_the_way(path: Path) -> Optional[Path]:
    """The first existing folder of `path`'s parents that is a file: nothing can be made under it."""
    return next((p for p in Path(path).parents if p.exists() and not p.is_dir()), None)


def refuse_overwriting(out, flag: str, reads=()) -> None:
    """An output a command was asked to write (`--out`) is never a file the command reads (`predict --out`
    onto its own --data replaced the user's data with predictions) nor a file of a run or checkpoint
    (`eval --out RUN/config.yaml` left a run that nothing could load): one line, before any work."""
    target = Path(out).resolve()  # through links: the file that would be replaced
    for r in reads:
        if Path(r).exists() and Path(r).resolve() == target:
            raise ConfigError(f"{flag} {out}: is the input {r}, which writing there would replace; "
                              f"choose another {flag}")
    for folder in target.parents:
        first = target.relative_to(folder).parts[0]
        if (folder / "MANIFEST.json").is_file():
            raise ConfigError(f"{flag} {out}: is inside the checkpoint {folder}, which a file added or replaced "
                              f"there would damage; choose another {flag}")
        if first in OWN and (folder / CONFIG).is_file() and any((folder / m).exists() for m in MARKS):
            raise ConfigError(f"{flag} {out}: is {first} of the run in {folder}, which writing there would damage; "
                              f"choose another {flag}")


def holds_run(path: Path) -> list[str]:
    """The run files in `path` (none: the folder is free to use)."""
    return [n for n in RUN_FILES if (path / n).exists()] if path.is_dir() else []


# LOCK (runfiles.py): held (flock) by the one process writing the folder; the kernel drops it at exit


@dataclass
class _Lease:
    fd: int
    count: int
    created: bool  # the folder was made to hold the lock: removed again when nothing else was written


OWN_COPY_WAIT = 3.0  # seconds a command waits for a lock held under its own pid (a forked child's copy)
_HELD: dict[str, _Lease] = {}  # this process's run-folder locks, by absolute path (re-entrant: CLI, then fit)
if hasattr(os, "register_at_fork"):  # a forked child holds none of them (filelock.py closed its copies)
    os.register_at_fork(after_in_child=_HELD.clear)


def acquire(path: Path) -> _Lease:
    """The run folder's one-writer lock, taken without waiting (one line when another process holds
    it), re-entrant within this process. Made with the folder when the folder is missing."""
    key = os.path.abspath(path)
    lease = _HELD.get(key)
    if lease is not None:
        lease.count += 1
        return lease
    path = Path(path)
    created = not path.exists()
    path.mkdir(parents=True, exist_ok=True)
    fd = open_lock(path / LOCK, "run folder")
    deadline = time.monotonic() + OWN_COPY_WAIT
    while not try_lock(fd) and holder(fd) == str(os.getpid()) and time.monotonic() < deadline:
        time.sleep(0.02)  # our own pid: a copy of our last hold that a child forked from a thread (one about to
        # exec or exit) still has; it goes within moments, so wait for it instead of refusing ourselves
    if not try_lock(fd):
        pid = holder(fd)
        unlock(fd)
        raise ConfigError(f"{path}: another ecotrain process (pid {pid}) is writing this run folder; "
                          "wait for it to end, or choose another --run-dir")
    lease = _HELD[key] = _Lease(fd, 1, created)
    return lease


def release(path: Path) -> None:
    key = os.path.abspath(path)
    lease = _HELD.get(key)
    if lease is None:
        return
    lease.count -= 1
    if lease.count:
        return
    del _HELD[key]
    unlock(lease.fd)  # closing the descriptor drops the flock
    if lease.created:  # a start that wrote nothing: leave no folder behind
        try:
            if [p.name for p in Path(path).iterdir()] == [LOCK]:
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass


def made_by_lock(path: Path) -> bool:
    """The folder did not exist before this process took its lock."""
    lease = _HELD.get(os.path.abspath(path))
    return lease is not None and lease.created


@contextlib.contextmanager
def hold(run_dir):
    """The lock over a command's whole life in a run folder: from its first decision ("is it finished?
    which checkpoint?") to its last rename. Nothing when `run_dir` is None (a fresh default folder) or
    cannot be a folder (RunFolder.plan says why in one line)."""
    path = Path(run_dir) if run_dir else None
    if os.environ.get("RANK", "0") != "0":  # torchrun: rank 0 holds it for the job
        path = None
    if path is None or (path.exists() and not path.is_dir()) or file_in_the_way(path) is not None \
            or (path.is_symlink() and not path.exists()):
        yield
        return
    acquire(path)
    try:
        yield
    finally:
        release(path)


class RunFolder:
    def __init__(self, path: Path, existed: bool, replace: list[str], is_main: bool, fresh: bool = False):
        self.path, self.existed, self.replace, self.is_main = path, existed, replace, is_main
        self.fresh = fresh  # neither resuming nor --overwrite: the folder must still hold no run when accepted
        self.accepted = False
        self._locked = False

    @classmethod
    def plan(cls, run_dir, name: str, dist, resuming: bool, overwrite: bool) -> "RunFolder":
        """Decide and check the folder; writes nothing. Under torchrun rank 0 picks the default
        name and every rank uses it."""
        path = Path(run_dir) if run_dir else Path(dist.broadcast_object(str(default_run_dir(name))))
        if path.exists() and not path.is_dir():
            raise ConfigError(f"--run-dir {path}: is a file, not a folder; choose a folder path")
        if path.is_symlink() and not path.exists():
            raise ConfigError(f"--run-dir {path}: is a link to {os.readlink(path)}, which does not exist; "
                              "create that folder or choose another path")
        blocked = file_in_the_way(path)
        if blocked is not None:
            raise ConfigError(f"--run-dir {path}: {blocked} is a file, so no folder can be made under it; "
                              "choose another path")
        ckpts = path / CHECKPOINTS
        if ckpts.exists() and not ckpts.is_dir():  # found before training, not at the first save
            raise CheckpointError(f"{ckpts}: is a file, so no checkpoint can be saved there; move it away")
        found = holds_run(path)
        if found and not resuming and not overwrite:
            raise ConfigError(f"{path}: already holds a run ({', '.join(found)}); continue it with `--resume auto` "
                              f"(or `ecotrain resume {path}`), choose a fresh --run-dir, or pass --overwrite to replace it")
        return cls(path, path.exists(), found if overwrite and not resuming else [], dist.is_main,
                   fresh=not resuming and not overwrite)

    def accept(self, config_dict: dict, metrics_offset: Optional[int] = None) -> None:
        """The start passed every check: only now is the folder written."""
        if self.is_main:
            self._claim()
            for name in self.replace:  # --overwrite: the old run's files go, nothing else
                p = self.path / name
                # a link goes, never what it points to: that may be the user's folder elsewhere
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)
            self.path.mkdir(parents=True, exist_ok=True)
            unshare_links(self.path)
            write_config(self.path, config_dict)
            if metrics_offset is not None:
                truncate(self.path / METRICS, metrics_offset)
        self.accepted = True

    def _claim(self) -> None:
        """One writer per run folder: a second `fit`/`resume` on it while the first runs is refused
        (two processes appending to one metrics.jsonl and pruning each other's checkpoints lose work)."""
        try:
            acquire(self.path)
        except ConfigError:
            self.existed = True  # the other process's folder: never removed by this start's discard()
            raise
        self._locked = True
        found = holds_run(self.path) if self.fresh else []
        if found:  # another process made a run here after plan() looked
            self.release()
            self.existed = True
            raise ConfigError(f"{self.path}: already holds a run ({', '.join(found)}), written while this one "
                              "started; choose a fresh --run-dir")

    def release(self) -> None:
        if self._locked:
            self._locked = False
            release(self.path)

    def discard(self) -> None:
        """A start that failed before it was accepted: remove the folder if this start made it."""
        made = not self.existed or made_by_lock(self.path)
        self.release()
        if not (self.is_main and made and self.path.is_dir()):
            return
        if os.path.abspath(self.path) not in _HELD:
            shutil.rmtree(self.path, ignore_errors=True)
            return
        for p in self.path.iterdir():  # the command still holds the lock: its release removes the folder
            if p.name != LOCK:
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)


def unshare_links(folder: Path) -> None:
    """A run file with other hard links (a user's backup of metrics.jsonl made with `ln`) is copied to a
    file of its own, renamed over it, before anything appends to it: the user's copy never changes."""
    for name in RUN_FILES:
        p = folder / name
        try:
            if p.is_file() and not p.is_symlink() and p.stat().st_nlink > 1:
                with safefile.open_regular(p, "run file") as f:  # is_file() above, but swapped since: not blocked
                    atomic_write(p, f.read())
        except (OSError, ConfigError):
            continue  # said by the write that follows, if it fails too


def truncate(path: Path, offset: int) -> None:
    """Drop metrics.jsonl lines written after the checkpoint (the killed run's last steps)."""
    if path.exists() and path.stat().st_size > offset:
        with open(path, "r+b") as f:
            f.truncate(offset)
            f.flush()
            os.fsync(f.fileno())
