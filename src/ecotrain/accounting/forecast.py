"""Grid carbon-intensity forecasts and when to train by them (`carbon.forecast`; docs/green.md).

A forecast file is read in one of three shapes:
- the Carbon Aware SDK's `/emissions/forecasts/current` answer: a list (or one object) with
  `forecastData: [{"timestamp": ISO, "duration": minutes, "value": g/kWh}, ...]`;
- ElectricityMaps' `/carbon-intensity/forecast` answer: `{"forecast": [{"datetime": ISO,
  "carbonIntensity": g/kWh}, ...]}` (`data` instead of `forecast` is taken too);
- a CSV of `time,gCO2e/kWh` rows (ISO times; a header row is allowed).
Each point holds from its time to the next point's (the last one: its `duration`, else the spacing
before it). A file that fits none of them is one line naming the file and the shape expected.

`plan` decides, at time `now`, whether to train or to wait, and until when: with a deadline, the
run trains in the cleanest slots between now and the deadline that together hold the time it still
needs (greedy by intensity: the cleanest hours first, as many as the remaining work fills); with a
threshold, it also trains whenever the intensity is at or below it. A deadline the remaining work
cannot meet even running every slot means: train now. Times are POSIX seconds (UTC).

What a file or a setting says is checked where it is read: an intensity must be a finite number >= 0
(NaN or infinity is refused, naming the file and the point or line), a time must lie within the
years 1 to 9999 in UTC (what a date can name). A far-off deadline (9999-12-31) is a deadline like any
other; a time computed past the year 9999 (a simulated clock run on from a far-future start) is
written as `after 9999-12-31T23:59:59Z`, not an error.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from ecotrain.base import safefile
from ecotrain.config.carbon import FORECAST_FILE
from ecotrain.base.errors import ConfigError
from ecotrain.base.userpath import user_path

SHAPES = ("a Carbon Aware SDK forecast (forecastData: timestamp, duration, value), an ElectricityMaps forecast "
          "(forecast: datetime, carbonIntensity), or a CSV of time,gCO2e/kWh rows")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}
FIRST = datetime(1, 1, 1, tzinfo=timezone.utc).timestamp()  # the times a date can name, in POSIX seconds
LAST = datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone.utc).timestamp()


@dataclass(frozen=True)
class Slot:
    start: float  # POSIX seconds
    end: float
    g_per_kwh: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


def parse_time(text, where: str) -> float:
    """An ISO 8601 time (a trailing Z, or no zone: UTC) as POSIX seconds."""
    try:
        t = datetime.fromisoformat(str(text).strip().replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"{where}: {str(text)[:40]!r} is not an ISO 8601 time (e.g. 2026-12-03T18:00:00Z)") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    out = t.timestamp()
    if not FIRST <= out <= LAST:  # 9999-12-31T23:00-05:00 is in the year 10000 in UTC
        raise ConfigError(f"{where}: {str(text)[:40]!r} lies outside the years 1 to 9999 in UTC; give a time "
                          "within them (e.g. 2026-12-03T18:00:00Z)")
    return out


def iso(t: float) -> str:
    """POSIX seconds as ISO 8601 UTC; a time past what a date can name (module doc) says so instead."""
    if t > LAST:
        return f"after {iso(LAST)}"
    if not t >= FIRST:  # NaN too
        return f"before {iso(FIRST)}"
    return datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z")


def parse_deadline(text: str, start: float) -> float:
    """`carbon.deadline`: an ISO time, or a duration from `start` (the run's first start): 90m, 12h, 2d."""
    m = _DURATION.match(text)
    if not m:
        return parse_time(text, "carbon.deadline")
    end = start + float(m.group(1)) * _UNIT[m.group(2)]
    if not end <= LAST:  # inf too: 400 digits of days
        raise ConfigError(f"carbon.deadline: {text.strip()[:40]!r} ends past the year 9999; give a shorter duration "
                          "(e.g. 12h) or an ISO time")
    return end


def _finite(v) -> float:
    """A JSON or CSV number as a float; an integer too big for one (10**400) is infinite."""
    try:
        return float(v)
    except OverflowError:
        return math.inf


def _intensity(v, where: str) -> float:
    """A forecast value, refused unless a finite number >= 0 (json reads NaN and Infinity, float() 'nan')."""
    v = _finite(v)
    if not math.isfinite(v):
        raise ConfigError(f"{where}: the carbon intensity is {v}; give a finite number of gCO2e/kWh (>= 0)")
    if v < 0:
        raise ConfigError(f"{where}: {v:g} is a negative carbon intensity; expected gCO2e/kWh >= 0")
    return v


def _points_json(data, path: Path) -> list[tuple[float, float, Optional[float]]]:
    if isinstance(data, list) and data and isinstance(data[0], dict) and "forecastData" in data[0]:
        data = data[0]  # the SDK answers a list of forecasts, one per location: the first
    rows = data
    if isinstance(data, dict):
        rows = next((data[k] for k in ("forecastData", "forecast", "data") if isinstance(data.get(k), list)), None)
    if not isinstance(rows, list) or not rows:
        raise ConfigError(f"{path}: no forecast points; expected {SHAPES}")
    out = []
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise ConfigError(f"{path}: point {i} is not an object; expected {SHAPES}")
        t = r.get("timestamp", r.get("datetime", r.get("time")))
        v = r.get("value", r.get("carbonIntensity"))
        if t is None or not isinstance(v, (int, float)) or isinstance(v, bool):
            raise ConfigError(f"{path}: point {i} lacks a time (timestamp/datetime) or a numeric value "
                              f"(value/carbonIntensity); expected {SHAPES}")
        d = r.get("duration")
        d = _finite(d) if isinstance(d, (int, float)) and not isinstance(d, bool) else None
        if d is not None and not (math.isfinite(d) and d > 0):
            raise ConfigError(f"{path}: point {i}: duration {d} is not a positive number of minutes")
        d = d * 60 if d is not None else None
        out.append((parse_time(t, f"{path}: point {i}"), _intensity(v, f"{path}: point {i}"), d))
    return out


def _points_csv(text: str, path: Path) -> list[tuple[float, float, Optional[float]]]:
    out = []
    for i, row in enumerate(csv.reader(io.StringIO(text))):
        if not row or not "".join(row).strip():
            continue
        if len(row) < 2:
            raise ConfigError(f"{path}: line {i + 1} has {len(row)} column(s); expected {SHAPES}")
        try:
            value = float(row[1])
        except ValueError:
            if i == 0:
                continue  # a header row
            raise ConfigError(f"{path}: line {i + 1}: {row[1][:30]!r} is not a number (gCO2e/kWh)") from None
        out.append((parse_time(row[0], f"{path}: line {i + 1}"), _intensity(value, f"{path}: line {i + 1}"), None))
    if not out:
        raise ConfigError(f"{path}: no forecast rows; expected {SHAPES}")
    return out


def read_forecast(path: str | Path) -> list[Slot]:
    """The forecast's slots in time order; one line for a file that is missing or of another shape."""
    path = user_path(path, "carbon.forecast", FORECAST_FILE)  # a FIFO would block the read forever
    try:
        text = safefile.read_text(path, "carbon forecast", 64 * safefile.MiB, fix=FORECAST_FILE)
    except OSError as exc:
        raise ConfigError(f"carbon.forecast: cannot read {path} ({getattr(exc, 'strerror', None) or exc})") from None
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"{path}: not valid JSON ({exc}); expected {SHAPES}") from None
        points = _points_json(data, path)
    else:
        points = _points_csv(text, path)
    points.sort(key=lambda p: p[0])
    slots = []
    for i, (t, v, d) in enumerate(points):
        if i + 1 < len(points):
            end = points[i + 1][0]
        else:
            end = t + (d if d else (t - points[i - 1][0] if i else 3600.0))
        if end <= t:
            raise ConfigError(f"{path}: two points at {iso(t)}; each time once")
        slots.append(Slot(t, end, v))
    return slots


def intensity_at(slots: list[Slot], t: float) -> float:
    """The forecast at time t; before its first slot the first value, after its last the last one."""
    for s in slots:
        if s.start <= t < s.end:
            return s.g_per_kwh
    return slots[0].g_per_kwh if t < slots[0].start else slots[-1].g_per_kwh


def chosen_slots(slots: list[Slot], now: float, need: float, deadline: float) -> list[Slot]:
    """The cleanest pieces of time between now and the deadline that together hold `need` seconds
    (ties: the earlier first). Past the forecast's end, its last value holds up to the deadline."""
    pieces = [Slot(max(s.start, now), min(s.end, deadline), s.g_per_kwh) for s in slots
              if s.end > now and s.start < deadline]
    last = max((s.end for s in slots), default=now)
    if deadline > max(last, now):
        pieces.append(Slot(max(last, now), deadline, slots[-1].g_per_kwh))
    pieces = [p for p in pieces if p.seconds > 0]
    if sum(p.seconds for p in pieces) < need:
        return []  # the deadline cannot be met even running throughout: no choice to make
    picked, held = [], 0.0
    for p in sorted(pieces, key=lambda p: (p.g_per_kwh, p.start)):
        if held >= need:
            break
        picked.append(p)
        held += p.seconds
    return sorted(picked, key=lambda p: p.start)


def plan(slots: list[Slot], now: float, need: float, deadline: Optional[float],
         threshold: Optional[float]) -> Optional[float]:
    """None: train now. Else the time to wait until (the next moment training is allowed)."""
    clean_now = threshold is not None and intensity_at(slots, now) <= threshold
    if clean_now:
        return None
    if deadline is None:
        if threshold is None:
            return None  # a forecast alone only prices the run (the ledger's intervals)
        later = [s.start for s in slots if s.start > now and s.g_per_kwh <= threshold]
        return later[0] if later else None  # never clean in the forecast: train now
    picked = chosen_slots(slots, now, need, deadline)
    if not picked or picked[0].start <= now:
        return None
    if threshold is not None:
        later = [s.start for s in slots if now < s.start < picked[0].start and s.g_per_kwh <= threshold]
        if later:
            return later[0]
    return picked[0].start
