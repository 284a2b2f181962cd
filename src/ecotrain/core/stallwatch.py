"""A stuck GPU under torchrun ends as one line and a non-zero exit, before NCCL's watchdog aborts the
process (SIGABRT with a C++ trace, and no ecotrain line).

A collective whose peer died never completes, and all the work queued behind it on the stream waits
with it. The training loop calls `Dist.mark(step)` after each backward and each optimizer step, and
`all_reduce_sum` after its collective: each records a CUDA event, queued behind the collectives
before it, without waiting for anything. A daemon thread drops the events that completed; when the
oldest one left was queued more than `distributed.timeout_seconds` ago, it prints one line and ends
the process. NCCL's own timeout is set longer (`nccl_timeout`), so this one fires first.

A rank waiting for rank 0's own work (a checkpoint write) waits on a CPU barrier with its GPU idle:
its events are complete and nothing fires. On CPU (gloo) a collective that times out raises in the
training thread and ends as one line already (distributed.collective_error): no watch there."""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
from typing import Callable

from ecotrain.base.errors import EXIT_FAILURE
from ecotrain.base.log import background


def nccl_timeout(timeout_s: float) -> float:
    """NCCL's watchdog timeout: later than the stall watch's, by the watch's poll and some slack."""
    return timeout_s + max(30.0, 0.25 * timeout_s)


class StallWatch:
    """`mark(step)` from the training thread; `make_marker()` -> an object with `query()` (True once
    the work queued before it is done): `torch.cuda.Event` recorded on the current stream."""

    def __init__(self, timeout_s: float, rank: int, make_marker: Callable, poll_s: float = 1.0,
                 exit: Callable[[int], None] = os._exit, out=None, prepare: Callable[[], None] = lambda: None):
        self.timeout_s, self.rank, self.make_marker, self.poll_s = timeout_s, rank, make_marker, poll_s
        self._prepare = prepare  # run first in the watch's thread (CUDA: its device)
        self.pending: collections.deque = collections.deque()  # (queued at, step, marker); appended here only
        self._exit, self._out = exit, out
        self._stop = threading.Event()
        self._thread = background("ecotrain-stall-watch", "the stall watch", self._run,
                                  "a rank that hangs is left to NCCL's own timeout")

    def mark(self, step: int) -> None:
        self.pending.append((time.monotonic(), step, self.make_marker()))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        self._prepare()
        while not self._stop.wait(self.poll_s):
            stalled = self.check()
            if stalled is not None:
                out = self._out or sys.stderr
                out.write(stalled + "\n")
                out.flush()
                self._exit(EXIT_FAILURE)
                return

    def check(self) -> str | None:
        """The line to end with, if the oldest unfinished work has waited past the timeout."""
        while self.pending and self.pending[0][2].query():  # only this thread pops
            self.pending.popleft()
        if not self.pending:
            return None
        queued, step, _ = self.pending[0]
        waited = time.monotonic() - queued
        if waited <= self.timeout_s:
            return None
        return (f"ecotrain: error: rank {self.rank}: the GPU work of step {step} has waited {waited:.0f} s for the "
                f"other ranks (distributed.timeout_seconds={self.timeout_s:g}); another rank probably died or hangs. "
                "Restart the job with --resume auto")
