"""SIGTERM / SIGINT: finish the current step, checkpoint, exit with EXIT_PREEMPTED (75).

The handler only sets a flag; the Checkpointer acts on it at the end of the step, so a signal
never interrupts a half-done optimizer update or a half-written file. A second SIGINT aborts.

Spot managers also announce a preemption without a signal: a file that appears (a SLURM or
Kubernetes preStop hook touching it) or a metadata endpoint that starts answering (GCP's
`instance/preempted`, AWS's `spot/instance-action`). `watch()` polls those in a daemon thread,
never in the step loop, and raises the same flag. `noticed_at` (monotonic) is when the notice came:
the Checkpointer reports the seconds from it to a complete checkpoint against `grace_seconds`.
An endpoint that answers something other than HTTP (garbage, a header line without end, too many
headers) is said once, as a warning, and polling goes on; anything else that ends the watch is one
warning too (log.background): SIGTERM still stops the run with a checkpoint."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import urllib.request
from pathlib import Path

from ecotrain.base.log import background, log, one_line

NOT_A_NOTICE = ("", "false", "none")  # GCP's endpoint answers FALSE until the notice
URL_TIMEOUT = 10.0  # seconds one poll of notice_url may wait: a metadata server answers in milliseconds


class Preemption:
    def __init__(self):
        self.requested: str | None = None
        self.noticed_at: float | None = None  # time.monotonic() of the first notice
        self._previous: dict = {}
        self._watching: threading.Event | None = None
        self._previous_unraisable = None

    def notice(self, what: str) -> None:
        if self.requested is None:
            self.requested, self.noticed_at = what, time.monotonic()
            log.warning(f"{what} received; finishing this step, then checkpoint and exit")

    def _handle(self, signum, frame):
        name = signal.Signals(signum).name
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt  # asked twice: stop now
        self.notice(name)

    def watch(self, cfg) -> None:
        """Poll `cfg.notice_file` / `cfg.notice_url` (config.PreemptionConfig) every `poll_seconds`
        in a daemon thread until `stop_watching()`; nothing to do when neither is set."""
        if not (cfg.notice_file or cfg.notice_url) or self._watching is not None:
            return
        stop = self._watching = threading.Event()
        stale = _stamp(cfg.notice_file)  # a notice left from an earlier segment is not this one's
        if stale is not None:
            log.warning(f"preemption.notice_file {cfg.notice_file} exists from before this start; ignored until "
                        "it is written again")

        def poll():
            said = False  # the endpoint's misbehaviour is told once, not at every poll
            while not stop.wait(cfg.poll_seconds if self.requested is None else 3600):
                now = _stamp(cfg.notice_file)
                if now is not None and now != stale:
                    self.notice(f"preemption notice file {cfg.notice_file}")
                    continue
                if not cfg.notice_url:
                    continue
                try:
                    preempted = _url_says_preempted(cfg.notice_url, min(cfg.poll_seconds, URL_TIMEOUT))
                except Exception as exc:  # answered, but not HTTP: http.client's BadStatusLine, LineTooLong, ...
                    if not said:
                        said = True
                        log.warning(one_line(f"preemption.notice_url {cfg.notice_url}: the answer is not HTTP "
                                             f"({type(exc).__name__}: {exc})", 240)
                                    + "; polling goes on, and SIGTERM still stops the run with a checkpoint")
                    continue
                if preempted:
                    self.notice(f"preemption notice from {cfg.notice_url}")

        background("ecotrain-preemption-notice", "the preemption notice watch", poll,
                   "SIGTERM still stops the run with a checkpoint")

    def stop_watching(self) -> None:
        if self._watching is not None:
            self._watching.set()
            self._watching = None

    def install(self) -> None:
        if self._previous or threading.current_thread() is not threading.main_thread():
            return  # installed already (the CLI does it first thing); signals need the main thread
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)

    def stop_at_once(self) -> None:
        """For commands that do not train (eval, predict, lr-find, report, ...): SIGINT and SIGTERM raise
        KeyboardInterrupt where the command is, so it stops now, its atomic writes leave nothing partial,
        and the CLI exits 130. `uninstall` restores the caller's handlers as before."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous = signal.signal(sig, _interrupt)
            self._previous.setdefault(sig, previous)
        if sys.unraisablehook is not _unraisable:
            self._previous_unraisable, sys.unraisablehook = sys.unraisablehook, _unraisable
            _BEFORE[0] = self._previous_unraisable

    def settle(self) -> None:
        """The command's work is committed (its file renamed into place): a stop signal from here on is
        ignored, so the exit code reports the work done, not a signal that came after it. `uninstall`
        restores the caller's handlers."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous = signal.signal(sig, signal.SIG_IGN)
            self._previous.setdefault(sig, previous)

    def __enter__(self) -> "Preemption":
        self.install()
        return self

    def __exit__(self, *exc) -> None:
        self.uninstall()

    def uninstall(self) -> None:
        self.stop_watching()
        if self._previous_unraisable is not None:
            sys.unraisablehook, self._previous_unraisable = self._previous_unraisable, None
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


def _stamp(path: str | None) -> tuple | None:
    try:
        st = Path(path).stat() if path else None
    except OSError:
        return None
    return None if st is None else (st.st_ino, st.st_mtime_ns, st.st_size)


def _url_says_preempted(url: str, timeout: float) -> bool:
    """One poll of a metadata endpoint: 404 or a failed connection is "no notice yet" (AWS answers 404
    until it has one; the endpoint may be briefly unreachable), a 200 with a body is the notice. An
    answer that is not HTTP raises (http.client.HTTPException, ValueError): the caller says it once."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (the user's own endpoint)
            return r.status == 200 and r.read(4096).decode("utf-8", "replace").strip().lower() not in NOT_A_NOTICE
    except OSError:  # URLError, HTTPError (404), refused, timed out, closed without an answer
        return False


def _interrupt(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


ASK_AGAIN_AFTER = 0.02  # seconds: the swallowing callback has returned by then


def _unraisable(u) -> None:
    """The KeyboardInterrupt `_interrupt` raised landed where Python swallows exceptions (a weakref
    callback such as importlib's module-lock cleanup, a __del__) and would be lost, the command going
    on: the signal is sent again a moment later, from a timer thread, so it lands in the command's
    own code. Anything else goes to the hook that was there before."""
    name = u.exc_value.args[0] if isinstance(u.exc_value, KeyboardInterrupt) and u.exc_value.args else None
    if name in ("SIGTERM", "SIGINT"):
        timer = threading.Timer(ASK_AGAIN_AFTER, os.kill, (os.getpid(), getattr(signal, name)))
        timer.daemon = True
        timer.start()
        return
    (_BEFORE[0] or sys.__unraisablehook__)(u)


_BEFORE: list = [None]  # the unraisable hook stop_at_once replaced
