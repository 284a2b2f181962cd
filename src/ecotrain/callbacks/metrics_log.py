"""metrics.jsonl: one JSON object per logged step and per evaluation."""

from __future__ import annotations

import json

from ecotrain.callbacks.base import Callback


class MetricsLogger(Callback):
    def __init__(self, path):
        self.path = path
        self.file = None

    def on_fit_start(self, state):
        self.file = open(self.path, "a", encoding="utf-8")

    def _write(self, record):
        # Each line reaches the OS as it is written: a SIGKILL (OOM killer, scheduler) then loses no logged
        # step, and resume.steps_past counts the steps a resume trains again. No fsync: the page cache
        # outlives the process, and only a power loss would need it, at a disk sync per line; after
        # one, a resume cuts this file back to its checkpoint's offset anyway (rundir.truncate).
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def on_log(self, state, record):
        self._write(record)

    def on_eval_end(self, state, record):
        self._write(record)

    def offset(self) -> int:
        """Bytes written so far; a checkpoint records it so a resume can cut later lines."""
        if self.file is None:
            return self.path.stat().st_size if self.path.exists() else 0
        self.file.flush()
        return self.file.tell()

    def on_fit_end(self, state):
        if self.file:
            self.file.close()
            self.file = None

    on_exception = lambda self, state, exc: self.on_fit_end(state)  # noqa: E731
