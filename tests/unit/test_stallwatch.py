"""The stall watch (stallwatch.py): work that stops completing ends the process with one line, before
NCCL's watchdog would; completed work, and a GPU left idle, never do. CUDA events are what it
watches on a GPU; here each marker is a real `threading.Event` that another thread sets when its
work is done, read by the watch's real thread."""

import io
import threading
import time

from ecotrain.core.distributed import Dist
from ecotrain.core.stallwatch import StallWatch, nccl_timeout


class Work:
    """A piece of queued work: done when `finish()` is called (from any thread)."""

    def __init__(self):
        self.done = threading.Event()

    def query(self) -> bool:
        return self.done.is_set()

    def finish(self):
        self.done.set()


def watch(timeout_s=0.3):
    queued, exits, out = [], [], io.StringIO()

    def make():
        queued.append(Work())
        return queued[-1]

    w = StallWatch(timeout_s, rank=3, make_marker=make, poll_s=0.02, exit=exits.append, out=out)
    return w, queued, exits, out


def test_work_that_completes_in_time_never_fires_however_long_the_run():
    w, queued, exits, out = watch()
    try:
        for step in range(1, 30):  # 0.6 s of steps, twice the timeout: each step's work completes
            w.mark(step)
            queued[-1].finish()
            time.sleep(0.02)
        time.sleep(0.5)  # and an idle GPU (rank 0 writing a checkpoint) after them: nothing pending
        assert exits == [] and out.getvalue() == "" and not w.pending
    finally:
        w.stop()


def test_stuck_work_ends_the_process_with_one_line_naming_the_rank_and_step():
    w, queued, exits, out = watch()
    try:
        w.mark(7)
        queued[-1].finish()
        w.mark(8)  # the collective behind this never completes: a peer died
        w.mark(8)
        deadline = time.monotonic() + 5
        while not exits and time.monotonic() < deadline:
            time.sleep(0.02)
        assert exits == [1]  # EXIT_FAILURE, once: the thread ends after it
        line = out.getvalue()
        assert line.count("\n") == 1 and line.startswith("ecotrain: error: rank 3: the GPU work of step 8 has waited")
        assert "distributed.timeout_seconds=0.3" in line and "--resume auto" in line
    finally:
        w.stop()


def test_check_waits_for_the_timeout_before_naming_the_stall():
    w, queued, exits, out = watch(timeout_s=60)
    try:
        w.mark(1)
        assert w.check() is None  # pending, but not for a minute yet
        w.pending[0] = (time.monotonic() - 61, 1, queued[0])  # as if queued 61 s ago
        assert "step 1 has waited 61 s" in w.check()
        queued[0].finish()
        assert w.check() is None and not w.pending
    finally:
        w.stop()


def test_nccl_times_out_after_the_watch():
    assert nccl_timeout(300) == 375 and nccl_timeout(10) == 40  # the watch's poll and slack before NCCL's
    Dist().mark(5)  # one process: nothing to watch, nothing to stop
    Dist().stop_watch()
