"""One descriptor budget for the shards a source reads (tar or Parquet).

A run may name more shards than the process may open files (`ulimit -n`, often 1024): keeping one
descriptor per shard fails at the limit with "Too many open files". Shards are opened when first
read and the most recently used few stay open; opening one more closes the least recently used.
A batch reads from a few shards at a time (the sampler shuffles within windows), so the budget
costs about one `open` per shard per window, not per sample.
"""

from __future__ import annotations

import contextlib
import os
from collections import OrderedDict
from typing import Any, Callable

try:
    import resource
except ImportError:  # not a POSIX system: no limit to read
    resource = None

MOST = 64  # open at once per process, at most: a sixteenth of the usual limit of 1024


def budget() -> int:
    """How many shard files a process keeps open: MOST, or less under a low `ulimit -n`, leaving the
    rest to the run (checkpoints, logs, loader workers' pipes)."""
    if resource is None:
        return MOST
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return MOST
    return max(2, min(MOST, soft // 16))


class OpenFiles:
    """`get(i)`: an open handle of file i, opened by `opener(i)`, closed by `closer(handle)` when it is
    the least recently used beyond the budget. A forked loader worker closes its copies of the
    parent's handles (the parent's stay open) and opens its own, so each process keeps to the budget.
    One thread of a process reads through it (as the loop and each loader worker do): a handle may be
    closed by the next `get`."""

    def __init__(self, opener: Callable[[int], Any], closer: Callable[[Any], None], limit: int | None = None):
        self.opener, self.closer = opener, closer
        self.limit = limit if limit is not None else budget()
        self._open: OrderedDict[int, Any] = OrderedDict()
        self._pid = os.getpid()

    def get(self, i: int):
        if self._pid != os.getpid():  # a forked worker: its copies of the parent's handles
            self.close()
            self._pid = os.getpid()
        h = self._open.get(i)
        if h is not None:
            self._open.move_to_end(i)
            return h
        while len(self._open) >= self.limit:
            self._close_one()
        h = self._open[i] = self.opener(i)
        return h

    def __len__(self) -> int:
        return len(self._open)

    def close(self) -> None:
        while self._open:
            self._close_one()

    def _close_one(self) -> None:
        with contextlib.suppress(OSError):  # a file already gone: nothing left to release
            self.closer(self._open.popitem(last=False)[1])

    def __getstate__(self):  # sent to a spawned worker: handles do not travel
        return {**self.__dict__, "_open": OrderedDict()}
