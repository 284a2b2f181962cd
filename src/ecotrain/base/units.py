"""Sizes in bytes as people write them (`2GiB`, `512MiB`, `1.5GB`): parsed for the config, shown in messages."""

from __future__ import annotations

import math
import re

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_BYTES_RE = re.compile(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*", re.IGNORECASE)


def parse_bytes(value) -> int:
    """`2GiB`, `512MiB`, `1.5GB`, `800M` or a plain number of bytes -> bytes. ValueError says what is accepted."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a size; give bytes or a size like 2GiB, 512MiB, 1.5GB")
    if isinstance(value, (int, float)):
        n, unit = float(value), ""
    else:
        m = _BYTES_RE.fullmatch(str(value))
        if not m or m.group(2).lower() not in _UNITS:
            raise ValueError(f"{value!r} is not a size; give bytes or a size like 2GiB, 512MiB, 1.5GB")
        n, unit = float(m.group(1)), m.group(2).lower()
    size = n * _UNITS[unit]
    if not math.isfinite(size) or size < 2**20:
        raise ValueError(f"{value!r} is less than 1 MiB; give the memory the run may use, e.g. 2GiB")
    return int(size)


def fmt_bytes(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"
