"""Progress for long work outside the training loop: generating data, caching a teacher's logits,
computing a Fisher information matrix. The training loop has its own bar (callbacks/progress.py).

    with work("generating mnist1d (5,000 samples)") as advance:      # a spinner and the elapsed time
        make()
    with work("teacher logits", total=len(data)) as advance:          # a bar with a count and an ETA
        for batch in batches:
            ...
            advance(len(batch))

It shows only when stderr is a terminal and this is rank 0 (under torchrun), through rich,
transient (the line goes when the work ends); elsewhere (logs, CI, tests, other ranks) it is
silent and `advance` costs one function call.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Callable, Iterator, Optional


def _noop(n: float = 1) -> None:
    pass


def enabled() -> bool:
    return os.environ.get("RANK", "0") == "0" and sys.stderr.isatty()


@contextlib.contextmanager
def work(description: str, total: Optional[float] = None) -> Iterator[Callable[[float], None]]:
    """Show progress of `description` while the block runs; yields `advance(n=1)`."""
    if not enabled():
        yield _noop
        return
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)

    columns = [SpinnerColumn(), TextColumn("ecotrain: {task.description}")]
    if total is not None:
        columns += [BarColumn(), MofNCompleteColumn(), TimeRemainingColumn()]
    columns.append(TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n=1: bar.advance(task, n)
