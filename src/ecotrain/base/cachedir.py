"""The one place that says where ecotrain's user cache lives: `$ECOTRAIN_CACHE` if set, else
`$XDG_CACHE_HOME/ecotrain`, else `~/.cache/ecotrain`. Its users: generated datasets (data/cache.py),
the thread count a probe picked (threads.py), the energy meter's hardware plan
(accounting/meter_plan.py), an MLflow registry's downloads. Standard library only: the CLI asks it
before torch is imported.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

ENV = "ECOTRAIN_CACHE"


def cache_dir() -> Optional[Path]:
    """The cache's root folder (not created here), or None when there is no home folder to put it in
    and neither variable names one (then nothing is cached)."""
    root = os.environ.get(ENV)
    if root:
        return _expanded(root)
    xdg = _expanded(os.environ.get("XDG_CACHE_HOME") or "")
    if xdg is not None and xdg.is_absolute():
        return xdg / "ecotrain"
    home = _passwd_home() if os.environ.get("HOME") == "" else _expanded("~")  # an empty HOME is "/" to expanduser
    # a relative HOME: a cache in whatever folder the run starts from would be no cache
    return home / ".cache" / "ecotrain" if home is not None and home.is_absolute() else None


def _expanded(path: str) -> Optional[Path]:
    """`path` with `~` expanded; None when `~` cannot be (HOME unset and no passwd entry for this uid)."""
    try:
        return Path(path).expanduser()
    except RuntimeError:  # pathlib's "Could not determine home directory."
        return None


def _passwd_home() -> Optional[Path]:
    """This user's home from the passwd database, or None (no entry, or no such database)."""
    try:
        import pwd

        return Path(pwd.getpwuid(os.getuid()).pw_dir) or None
    except (ImportError, KeyError, OSError):
        return None
