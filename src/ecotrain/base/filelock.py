"""One way to take a lock file (the run folder's `.ecotrain.lock`, the registry's `registry.lock`), and a
folder's own lock (`try_lock_folder`: tokenize's output, whose listing is the user's).

The file is opened without following a symbolic link (`O_NOFOLLOW`) and without truncating it, and
must be a regular file: a lock that is a link could make ecotrain write its pid into any file the
user (or root) can write; one that is a folder or a device is refused in one line. Only after
`flock` succeeds is the file emptied and the holder's pid written (so a waiter can name it). The
kernel drops the lock when the holder exits or is killed.

A flock belongs to the open file, and a forked child (a DataLoader worker: torch forks them) shares
it: killed with SIGKILL, the holder's lock would stay held by its workers until their watchdog ends
them (up to 5 s), and a resume started at once was refused ("another ecotrain process is writing this
run folder"). So a forked child closes its copies at once (`os.register_at_fork`); closing a copy
never releases the parent's lock. Release with `unlock`, which keeps that record true.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import threading
from pathlib import Path

from ecotrain.base.errors import ConfigError


def open_lock(path: Path, what: str) -> int:
    """A descriptor of the lock file `path` (created if missing); one ConfigError line for anything that
    is not a plain file ecotrain may write."""
    path = Path(path)
    try:
        with _OPENING:  # a fork in another thread now would copy a descriptor the child does not close
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            _OWNED.add(fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP or path.is_symlink():
            raise ConfigError(f"{path}: the {what} lock is a symbolic link (to {os.readlink(path)}); ecotrain "
                              "never writes through one: remove the link") from None
        if exc.errno == errno.EISDIR or path.is_dir():
            raise ConfigError(f"{path}: the {what} lock is a folder; remove it (ecotrain makes it as a file)") from None
        raise ConfigError(f"{path}: cannot open the {what} lock ({exc.strerror or exc}); check the folder's "
                          "permissions") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        unlock(fd)
        raise ConfigError(f"{path}: the {what} lock is not a regular file; remove it (ecotrain makes it as a file)")
    return fd


# Descriptors of lock files, from the moment they are opened: a forked child closes its copies at once.
# A flock belongs to the open file description, so a copy a child kept (a child forked by another thread,
# py-cpuinfo's, between the open and the flock) would hold the lock after the parent released it: the next
# command in the folder was refused, "another ecotrain process (pid <ours>)" (CI). `_OPENING` makes the
# open and the record one step as a fork sees them.
_OWNED: set[int] = set()
_OPENING = threading.Lock()


def _drop_in_child() -> None:
    _OPENING.release()
    for fd in _OWNED:
        try:
            os.close(fd)
        except OSError:
            pass
    _OWNED.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_OPENING.acquire, after_in_parent=_OPENING.release, after_in_child=_drop_in_child)


def unlock(fd: int) -> None:
    """Release a lock `try_lock` took (or give back a descriptor `open_lock` opened): close it."""
    _OWNED.discard(fd)
    os.close(fd)


def try_lock_folder(path: Path) -> int | None:
    """Lock a folder itself (flock on its own descriptor), without waiting: nothing is written into it,
    so a folder whose listing is the user's (tokenize's output) keeps it. The descriptor to `unlock`,
    or None when another process holds the folder."""
    with _OPENING:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        _OWNED.add(fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        unlock(fd)
        return None
    return fd


def try_lock(fd: int) -> bool:
    """Take the lock without waiting; True when taken (then the file holds this pid)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    _OWNED.add(fd)
    try:  # ours now: a regular file opened without following links
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
    except OSError:
        pass  # a full disk: the lock holds without the pid a waiter's message would name
    return True


def holder(fd: int) -> str:
    """The pid written by whoever holds the lock, or '?'."""
    return os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
