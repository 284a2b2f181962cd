"""Test-only callback: note this process's children (the DataLoader's workers) in a file, then
SIGKILL this process, so a test can check that none outlives it."""

import os
import signal
from pathlib import Path

from ecotrain import Callback


def children(pid: int) -> list[int]:
    """The pids whose parent is `pid` (from /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


class NoteChildrenThenKill(Callback):
    def __init__(self, step: int, out: str):
        self.step, self.out = step, out

    def on_step_end(self, state):
        if state.step == self.step:
            Path(self.out).write_text(" ".join(map(str, children(os.getpid()))))
            os.kill(os.getpid(), signal.SIGKILL)
