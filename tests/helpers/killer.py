"""Test-only callbacks that kill their own process with a real signal (loaded via `callbacks:`)."""

import os
import signal
import time

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
    """From step `step` on, the next checkpoint write SIGKILLs the process in its middle: after the
    tensors and meta.json are in the temporary folder, before the manifest and the rename. (A
    watcher thread polling for the temporary folder raced the save and could miss it.)"""

    def __init__(self, step: int):
        self.step, self.armed = step, False

    def on_step_end(self, state):
        if state.step >= self.step and not self.armed:
            self.armed = True
            from ecotrain.checkpoint import format as fmt

            def digest_then_die(path):  # the manifest's checksums come next: the save is half done
                os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(60)  # never reached: SIGKILL cannot be caught

            fmt._digest = digest_then_die


class SigtermAt(Callback):
    """SIGTERM this process at the start of step `step`: the real handler checkpoints at the end of it."""

    def __init__(self, step: int):
        self.step = step

    def on_step_start(self, state):
        if state.step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)
