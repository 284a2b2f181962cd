"""ecotrain's messages go through the `ecotrain` logger, so users can silence or redirect them.

The CLI installs one stderr handler with one format (`ecotrain: warning: ...`); under torchrun
only rank 0 emits (`RankZeroFilter`), so a message is printed once, not once per rank. The
one-line user errors (`ecotrain: error: ...`) and a command's own results stay on the CLI.

`background` is the one boundary of ecotrain's own background threads (the preemption notice watch,
the stall watch): whatever ends a thread's body early is one warning line here, never a traceback
from the thread.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Callable

log = logging.getLogger("ecotrain")


class RankZeroFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return os.environ.get("RANK", "0") == "0"


class _Format(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        level = "" if record.levelno == logging.INFO else f"{record.levelname.lower()}: "
        return f"ecotrain: {level}{record.getMessage()}"


class _Stderr(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time (a test's capture, a redirected stream)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


def setup_cli_logging(level: int = logging.INFO) -> None:
    """One stderr handler for the command line (idempotent)."""
    if any(getattr(h, "_ecotrain", False) for h in log.handlers):
        return
    handler = _Stderr()
    handler._ecotrain = True  # type: ignore[attr-defined]
    handler.setFormatter(_Format())
    handler.addFilter(RankZeroFilter())
    log.addHandler(handler)
    log.setLevel(level)
    log.propagate = False


def one_line(text: str, limit: int = 300) -> str:
    """`text` on one line (an exception's message may span several, or carry a server's bytes), cut to `limit`."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def background(name: str, what: str, body: Callable[[], None], after: str = "") -> threading.Thread:
    """Run `body` in a started daemon thread `name`. An exception that ends it is one warning line
    `{what} stopped: {Type}: {message}; {after}` (`after`: what still works without it)."""
    def run() -> None:
        try:
            body()
        except Exception as exc:  # the boundary: the thread ends, the run goes on and is told once
            log.warning(one_line(f"{what} stopped: {type(exc).__name__}: {exc}") + (f"; {after}" if after else ""))

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread
