"""The registry's lock: one writer at a time, across processes (no torch import, so it is cheap).

`fcntl.flock` on REGISTRY/registry.lock: the kernel releases it when the holder exits or is killed, so
a crashed update never leaves the registry locked. The holder's pid is written into the file so the
waiter's message can name it."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path
from typing import Iterator

from ecotrain.errors import ConfigError

LOCK_TIMEOUT = 600.0  # seconds a writer waits for another before giving up with one line


@contextlib.contextmanager
def registry_lock(root: Path, timeout: float = LOCK_TIMEOUT) -> Iterator[None]:
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise ConfigError(f"--registry {root}: is a file, not a registry folder")
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / "registry.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                    raise ConfigError(f"{root}: the registry is locked by another process (pid {holder}) for "
                                      f"more than {timeout:.0f}s; wait for it to finish") from None
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock
