"""Paths the user names (a recipe, data.path, --init-from, --carbon-forecast, --data, --label-map, a
method's `from:` file), checked before anything opens them.

Opening a FIFO that has no writer blocks forever, and a stop signal cannot end the wait (the SIGTERM
handler only raises a flag, preemption.py); a device reads without end. So a path to be read must be
a regular file, or a folder where a folder is expected: `user_path` says so from `os.stat`, which
never opens the path, in one line (what, where, what to give instead) and the caller's error class
(ConfigError or DataError: exit 2).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ecotrain.base.errors import ConfigError, os_error_line
from ecotrain.base.safefile import kind


def user_path(path: str | Path, what: str, expect: str, *, folder: bool = False, error: type = ConfigError) -> Path:
    """`path` as a Path when it is a regular file (or, with `folder`, a folder); else `error` with one line
    `{what}: {path} <what is wrong>; {expect}`. `what` names the input (`--init-from`, `data.path`);
    `expect` says what to give instead (`give the .npz file`). Links are followed: a link to a FIFO is
    a FIFO. A folder where a file is expected says `is a folder`."""
    p = Path(path)
    try:
        mode = os.stat(p).st_mode
    except FileNotFoundError:
        where = "" if p.is_absolute() else f" (a relative path is read from the current folder, {Path.cwd()})"
        raise error(f"{what}: {p} not found{where}; {expect}") from None
    except ValueError:  # a NUL byte in the path
        raise error(f"{what}: {str(p)!r} holds a NUL byte, which no path may; {expect}") from None
    except OSError as exc:  # a loop of links, a name too long, a part that is a file
        raise error(f"{what}: {os_error_line(exc, p)}") from None
    if stat.S_ISREG(mode) or (folder and stat.S_ISDIR(mode)):
        return p
    if stat.S_ISDIR(mode):
        raise error(f"{what}: {p} is a folder; {expect}")
    raise error(f"{what}: {p} is {kind(mode)}{' or a folder' if folder else ''}; {expect}")
