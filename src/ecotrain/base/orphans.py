"""Child processes end with their parent and leave nothing behind.

A child whose parent is killed (SIGKILL, the OOM killer, a scheduler's kill) is not told by default:
a measuring worker (assembly/memory_worker.py) would train on as an orphan and keep its temporary folder.

- `die_with_parent(sig)`, in the child: on Linux the kernel sends `sig` when the parent ends
  (PR_SET_PDEATHSIG, via ctypes). A no-op elsewhere. The DataLoader's workers use it with SIGKILL
  (data/loader.py); torch's own watchdog there polls the parent only every 5 s.
- `parent_pipe()` in the parent and `watch_parent(fd, folder)` in the child: the child reads a pipe
  the parent holds open; end of file means the parent is gone, however it ended (any OS, and also
  when it died before the child could ask the kernel). Then the child removes its folder and exits.

PR_SET_PDEATHSIG follows the parent *thread* that started the child: start children from a thread
that outlives them (subprocess.run waits, so its caller does).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
from pathlib import Path

PR_SET_PDEATHSIG = 1  # linux/prctl.h
GONE_EXIT = 128 + signal.SIGHUP  # the status of a child that ended because its parent did (no one reads it)


def die_with_parent(sig: int = signal.SIGKILL, parent: int | None = None) -> bool:
    """Ask the kernel to send `sig` to this process when its parent ends (Linux); False where it cannot.
    `parent`: the pid the parent had; if it is already gone, this process exits at once."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    # not "getppid() == 1": ecotrain may itself be pid 1 (a container's entry point)
    if parent is not None and os.getppid() != parent:  # it died before prctl took effect
        os._exit(GONE_EXIT)
    return True


def parent_pipe() -> tuple[int, int]:
    """(read end for the child: pass it with `pass_fds`, write end the parent keeps open until the
    child is done). Both are close-on-exec, so no other program the parent starts holds them."""
    return os.pipe()


def watch_parent(fd: int, folder: Path | None = None) -> None:
    """In the child: when the parent ends (the pipe's end of file, or SIGHUP from the kernel on Linux),
    remove `folder` and exit. Call it from the main thread (the signal handler needs it)."""
    def gone(*_):
        _leave(folder)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGHUP, gone)  # a catchable PDEATHSIG: the folder goes too
        die_with_parent(signal.SIGHUP)
    threading.Thread(target=_read_until_eof, args=(fd, gone), name="ecotrain-parent-watch", daemon=True).start()


def _read_until_eof(fd: int, gone) -> None:
    try:
        while os.read(fd, 512):  # nothing is ever written: only the end of file matters
            pass
    except OSError:
        pass
    gone()


def _leave(folder: Path | None) -> None:
    if folder is not None:
        for _ in range(3):  # the main thread may write into it meanwhile
            shutil.rmtree(folder, ignore_errors=True)
            if not os.path.lexists(folder):
                break
    os._exit(GONE_EXIT)
