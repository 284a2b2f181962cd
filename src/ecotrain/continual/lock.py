"""The registry's lock: one writer at a time, across processes (no torch import, so it is cheap).

`fcntl.flock` on REGISTRY/registry.lock: the kernel releases it when the holder exits or is killed, so
a crashed update never leaves the registry locked. The holder's pid is written into the file so the
waiter's message can name it."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Iterator

from ecotrain.base.errors import ConfigError
from ecotrain.base.filelock import holder, open_lock, try_lock, unlock

LOCK_TIMEOUT = 600.0  # seconds a writer waits for another before giving up with one line


@contextlib.contextmanager
def registry_lock(root: Path, timeout: float = LOCK_TIMEOUT) -> Iterator[None]:
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise ConfigError(f"--registry {root}: is a file, not a registry folder")
    root.mkdir(parents=True, exist_ok=True)
    fd = open_lock(root / "registry.lock", "registry")
    try:
        deadline = time.monotonic() + timeout
        while not try_lock(fd):
            if time.monotonic() >= deadline:
                pid = holder(fd)  # what the holder wrote: a pid, unless the file was damaged (then not shown)
                raise ConfigError(f"{root}: the registry is locked by another process "
                                  f"({'pid ' + pid if pid.isdigit() else 'pid unknown'}) for more than "
                                  f"{timeout:.0f}s; wait for it to finish") from None
            time.sleep(0.05)
        yield
    finally:
        unlock(fd)  # closing the descriptor releases the flock
