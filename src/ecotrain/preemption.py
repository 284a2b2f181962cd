"""SIGTERM / SIGINT: finish the current step, checkpoint, exit with EXIT_PREEMPTED (75).

The handler only sets a flag; the Checkpointer acts on it at the end of the step, so a signal
never interrupts a half-done optimizer update or a half-written file. A second SIGINT aborts."""

from __future__ import annotations

import signal
import threading

from ecotrain.log import log


class Preemption:
    def __init__(self):
        self.requested: str | None = None
        self._previous: dict = {}

    def _handle(self, signum, frame):
        name = signal.Signals(signum).name
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt  # asked twice: stop now
        self.requested = name
        log.warning(f"{name} received; finishing this step, then checkpoint and exit")

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

    def __enter__(self) -> "Preemption":
        self.install()
        return self

    def __exit__(self, *exc) -> None:
        self.uninstall()

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


def _interrupt(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)
