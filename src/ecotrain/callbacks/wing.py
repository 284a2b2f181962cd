"""What a wing (accounting, tracking, a user's own) is given when it adds its callbacks to a run.

A wing is a function `WingContext -> list[Callback]`; ecotrain/assembly/wings.py holds the list a run uses
(the one registration point). The core builds its own callbacks and the Checkpointer first, then
asks each wing; the order they run in is what the callbacks declare (`after`, `before`), so a wing
needs to know nothing of where the core put its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ecotrain.callbacks.base import Callback


@dataclass(frozen=True)
class WingContext:
    config: Any  # the run's Config
    state: Any  # its TrainState (a wing may add a cost listener: state.cost_listeners)
    run_dir: Path
    is_main: bool  # rank 0 (or the only process): the one that writes files
    eval_samples: int  # samples in one evaluation pass (the validation split; 0 without one)
    checkpointer: Callback  # the run's Checkpointer (a wing that pauses a run saves through it)
    preemption: Optional[Any] = None  # the stop-signal handler (preemption.Preemption)
    tokens_per_sample: Optional[float] = None  # a language model's data: tokens a sample holds (assemble.tokens_per_sample)


Wing = Callable[[WingContext], Sequence[Callback]]
