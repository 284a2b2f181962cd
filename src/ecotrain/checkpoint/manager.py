"""Where checkpoints live in a run folder, which to keep, writing in the background, finding the
newest valid one."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path
from typing import Optional

from ecotrain.checkpoint.format import verify_checkpoint, write_checkpoint
from ecotrain.checkpoint.sharded import write_sharded, write_sharded_async
from ecotrain.base.errors import CheckpointError
from ecotrain.base.log import log
from ecotrain.base.runfiles import RunFiles


def checkpoint_dir(run_dir: Path) -> Path:
    return RunFiles(run_dir).checkpoints


def _step_of(p: Path) -> int:
    return int(p.name.split("-")[1])


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete-looking checkpoint folders, newest first (temporary folders are skipped)."""
    d = checkpoint_dir(run_dir)
    if not d.is_dir():
        return []
    try:
        found = [p for p in d.iterdir()
                 if p.name.startswith("step-") and p.name[5:].isascii() and p.name[5:].isdigit() and p.is_dir()]
    except OSError as exc:
        raise CheckpointError(f"{d}: cannot list the checkpoints ({exc.strerror or exc})") from None
    return sorted(found, key=_step_of, reverse=True)


def latest_valid(run_dir: Path, warn=None) -> Optional[Path]:
    """The newest checkpoint that verifies; each newer broken one is reported and skipped.
    `warn(message)` gets one message per skipped checkpoint (default: `ecotrain: warning: ...` on stderr)."""
    if warn is None:
        warn = log.warning
    for p in list_checkpoints(run_dir):
        try:
            verify_checkpoint(p)  # manifest, checksums, safetensors headers, meta.json's tensors present
            return p
        except CheckpointError as exc:
            warn(f"skipping checkpoint: {exc}")
    return None


class CheckpointManager:
    """Writes checkpoints (optionally in a background thread) and keeps the last K plus the best."""

    def __init__(self, run_dir: Path, keep_last: int = 2, background: bool = False):
        self.dir = checkpoint_dir(run_dir)
        self.keep_last, self.background = keep_last, background
        self.best: Optional[Path] = None
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None
        self._swept = False  # the temporary folders of killed saves are removed at the first save

    def save(self, step: int, tensors: dict, meta: dict, is_best: bool = False, shards=None, dist=None) -> Path:
        self.wait()  # one save in flight at a time; also surfaces a failed background save
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a file in the way, a read-only or full disk: exit 3, not a traceback
            raise CheckpointError(f"could not create {self.dir}: {exc.strerror or exc}; free the path or the disk, "
                                  "then resume") from None
        folder = self.dir / f"step-{step:08d}"
        if shards is not None and self.background:  # FSDP: shards staged now, written by DCP in the background
            finish = write_sharded_async(folder, tensors, meta, shards, dist, dist.checkpoint_group())
            self._thread = threading.Thread(target=self._run_sharded, args=(finish, folder, is_best, dist.is_main),
                                            daemon=True)
            self._thread.start()
        elif shards is not None:  # FSDP: every rank writes its shard, together (synchronously)
            write_sharded(folder, tensors, meta, shards, dist)
            if dist.is_main:
                self.best = folder if is_best else self.best
                self._prune()
        elif self.background:
            self._thread = threading.Thread(target=self._run, args=(folder, tensors, meta, is_best), daemon=True)
            self._thread.start()
        else:
            self._write(folder, tensors, meta, is_best)
        return folder

    def _run(self, folder, tensors, meta, is_best) -> None:
        try:
            self._write(folder, tensors, meta, is_best)
        except BaseException as exc:  # re-raised in the training thread by wait()
            self._error = exc

    def _run_sharded(self, finish, folder, is_best, is_main) -> None:
        try:
            finish()
            if is_main:
                self.best = folder if is_best else self.best
                self._prune()
        except BaseException as exc:  # re-raised in the training thread by wait()
            self._error = exc

    def _write(self, folder, tensors, meta, is_best) -> None:
        write_checkpoint(folder, tensors, meta)
        if is_best:
            self.best = folder
        self._prune()

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def _prune(self) -> None:
        keep = set(list_checkpoints(self.dir.parent)[: self.keep_last])
        if self.best is not None:
            keep.add(self.best)
        for p in list_checkpoints(self.dir.parent):
            if p not in keep:
                shutil.rmtree(p, ignore_errors=True)
        if not self._swept:  # once: only a process that died before this one can have left them
            self._swept = True
            for p in stale_temporaries(self.dir):
                shutil.rmtree(p, ignore_errors=True)


def stale_temporaries(folder: Path) -> list[Path]:
    """`.tmp-step-N-PID` folders left by a process killed inside a save (write_checkpoint names them
    by its pid): those whose process is gone. A live pid's folder may be a save in flight."""
    out = []
    for p in folder.glob(".tmp-step-*-*"):
        pid = p.name.rsplit("-", 1)[1]
        if pid.isdigit() and not _alive(int(pid)):
            out.append(p)
    return out


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True

