"""Test-only callback: a user pressing Ctrl-C twice while a checkpoint is being written."""

import os
import signal

from ecotrain import Callback


class SigintTwiceDuringSave(Callback):
    """From step `step` on, the next checkpoint write gets two SIGINTs in its middle (after the tensors
    and meta.json are in the temporary folder, before the manifest): the first asks for the preemption
    checkpoint, the second stops at once (preemption.py), from inside the save."""

    def __init__(self, step: int):
        self.step, self.armed = step, False

    def on_step_end(self, state):
        if state.step >= self.step and not self.armed:
            self.armed = True
            from ecotrain.checkpoint import format as fmt

            original = fmt._digest

            def digest_then_interrupt(path):  # the manifest's checksums come next: the save is half done
                fmt._digest = original
                os.kill(os.getpid(), signal.SIGINT)
                os.kill(os.getpid(), signal.SIGINT)  # delivered before kill() returns: raises here
                return original(path)

            fmt._digest = digest_then_interrupt
