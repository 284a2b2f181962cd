"""Test-only callbacks that kill their own process with a real signal (loaded via `callbacks:`)."""

import os
import signal
import time

from ecotrain import Callback


class KillAt(Callback):
    """Send `sig` to this process at the end of step `step` (before that step's checkpoint);
    under torchrun only on rank `rank` when given, and only in torchrun's restart number `attempt`
    when given (TORCHELASTIC_RESTART_COUNT: 0 for the first try)."""

    def __init__(self, step: int, sig: str = "SIGKILL", rank: int | None = None, attempt: int | None = None):
        self.step, self.sig, self.rank, self.attempt = step, getattr(signal, sig), rank, attempt

    def on_step_end(self, state):
        attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        if state.step == self.step and self.rank in (None, state.dist.rank) and self.attempt in (None, attempt):
            os.kill(os.getpid(), self.sig)


class KillDuringSave(Callback):
    """From step `step` on, the next checkpoint write sends `sig` to the process in its middle: after
    the tensors and meta.json are in the temporary folder, before the manifest and the rename. SIGKILL
    dies there; SIGTERM lets the save finish, and the next step ends with the preemption checkpoint.
    (A watcher thread polling for the temporary folder raced the save and could miss it.)"""

    def __init__(self, step: int, sig: str = "SIGKILL"):
        self.step, self.sig, self.armed = step, getattr(signal, sig), False

    def on_step_end(self, state):
        if state.step >= self.step and not self.armed:
            self.armed = True
            from ecotrain.checkpoint import format as fmt

            original, sig = fmt._digest, self.sig

            def digest_then_signal(path):  # the manifest's checksums come next: the save is half done
                fmt._digest = original
                os.kill(os.getpid(), sig)
                if sig == signal.SIGKILL:
                    time.sleep(60)  # never reached: SIGKILL cannot be caught
                return original(path)

            fmt._digest = digest_then_signal


class SigtermAt(Callback):
    """SIGTERM this process at the start of step `step`: the real handler checkpoints at the end of it."""

    def __init__(self, step: int):
        self.step = step

    def on_step_start(self, state):
        if state.step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


class SigtermDuringEval(Callback):
    """SIGTERM this process from inside the `nth` validation pass (between two of its batches'
    forwards): the evaluation finishes, then the step ends with the preemption checkpoint."""

    def __init__(self, nth: int):
        from ecotrain.core import loop

        original, calls = loop.evaluate, [0]

        def evaluate(model, source, *args, **kwargs):
            calls[0] += 1
            if calls[0] == nth:
                real_forward = model.forward

                def forward(*a, **k):  # the first batch's forward sends the signal
                    model.forward = real_forward
                    os.kill(os.getpid(), signal.SIGTERM)
                    return real_forward(*a, **k)

                model.forward = forward
            return original(model, source, *args, **kwargs)

        loop.evaluate = evaluate


class PauseAt(Callback):
    """At the end of step `step`: create `marker`, then wait (up to 120 s) until `release` exists, so a
    test can act while this run holds its folder."""

    def __init__(self, step: int, marker: str, release: str):
        self.step, self.marker, self.release = step, marker, release

    def on_step_end(self, state):
        if state.step == self.step:
            from pathlib import Path

            Path(self.marker).touch()
            deadline = time.monotonic() + 120
            while not Path(self.release).exists() and time.monotonic() < deadline:
                time.sleep(0.02)


class SigtermAtEnvStep(Callback):
    """SIGTERM every rank at the end of step `$ECOTRAIN_TEST_SIGTERM_AT` (unset: never): segments of one
    run stopped at different steps with the very same config (a resume refuses a changed one)."""

    def on_step_end(self, state):
        if str(state.step) == os.environ.get("ECOTRAIN_TEST_SIGTERM_AT"):
            os.kill(os.getpid(), signal.SIGTERM)


class TouchAt(Callback):
    """Create the file `path` at the end of step `step`: a preemption notice arriving from outside
    (a preStop hook touching preemption.notice_file, or what a test endpoint reads)."""

    def __init__(self, step: int, path: str):
        self.step, self.path = step, path

    def on_step_end(self, state):
        if state.step == self.step:
            from pathlib import Path

            Path(self.path).write_text("notice")
