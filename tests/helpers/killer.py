"""Test-only callbacks that kill their own process with a real signal (loaded via `callbacks:`)."""

import os
import signal
import threading
import time
from pathlib import Path

from ecotrain import Callback


class KillAt(Callback):
    """Send `sig` to this process at the end of step `step` (before that step's checkpoint);
    under torchrun only on rank `rank` when given."""

    def __init__(self, step: int, sig: str = "SIGKILL", rank: int | None = None):
        self.step, self.sig, self.rank = step, getattr(signal, sig), rank

    def on_step_end(self, state):
        if state.step == self.step and self.rank in (None, state.dist.rank):
            os.kill(os.getpid(), self.sig)


class KillDuringSave(Callback):
    """From step `step` on, a watcher thread SIGKILLs the process as soon as a checkpoint's
    temporary folder exists, i.e. in the middle of writing it."""

    def __init__(self, step: int):
        self.step, self.started = step, False

    def on_step_end(self, state):
        if state.step >= self.step and not self.started:
            self.started = True
            folder = Path(state.run_dir) / "checkpoints"
            threading.Thread(target=self._watch, args=(folder,), daemon=True).start()

    @staticmethod
    def _watch(folder: Path):
        while True:
            if folder.is_dir() and any(p.name.startswith(".tmp-") for p in folder.iterdir()):
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(0.0001)
