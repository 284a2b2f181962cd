"""Start-up without the cyclic garbage collector.

Importing torch, and the compiler its optimizers import (`torch._dynamo`), allocates millions of
objects that live as long as the process. The collector's automatic passes scan them again and again
and free next to nothing: about a fifth of that import's CPU time (bench/startup.py). The `ecotrain`
program pauses the collector from its first line (`cli.main`) until the work begins: a command
that does not train resumes it once its handler's module is imported (`cli.program._dispatch`); a training
loop resumes it at its start (`loop.train`), where it freezes the set-up's objects and manages the
collector itself; `cli.main` resumes it in any case when the command ends. A collector the caller
had disabled stays disabled.
"""

from __future__ import annotations

import gc

_PAUSED = False  # this module disabled the collector, and no one has resumed it since


def pause() -> None:
    global _PAUSED
    if gc.isenabled():
        gc.disable()
        _PAUSED = True


def resume() -> None:
    global _PAUSED
    if _PAUSED:
        _PAUSED = False
        gc.enable()
