"""A test's guard against a read that blocks (a FIFO opened without O_NONBLOCK waits for a writer forever):
SIGALRM after `seconds` raises in the main thread, which interrupts the blocked open or read, so the
test fails with a message instead of hanging the suite."""

import contextlib
import signal


class Hung(AssertionError):
    pass


@contextlib.contextmanager
def deadline(seconds: float = 20.0, what: str = "the read"):
    def _ring(signum, frame):
        raise Hung(f"{what} was still blocked after {seconds:g} s (a FIFO opened without O_NONBLOCK?)")

    before = signal.signal(signal.SIGALRM, _ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
