"""Test-only: a callback that sends this process a real signal once, in one named run folder (a trial
of `ecotrain green`), and leaves a marker so that the resumed search is not killed again."""

import os
import signal
from pathlib import Path

from ecotrain import Callback


class KillOnceIn(Callback):
    """At the end of step `step` of the run whose folder is named `run`, if `marker` does not exist:
    create it and send `sig` to this process."""

    def __init__(self, run: str, step: int, marker: str, sig: str = "SIGTERM"):
        self.run, self.step, self.marker, self.sig = run, step, Path(marker), getattr(signal, sig)

    def on_step_end(self, state):
        if state.step == self.step and state.run_dir is not None and Path(state.run_dir).name == self.run \
                and not self.marker.exists():
            self.marker.touch()
            os.kill(os.getpid(), self.sig)
