"""The `carbon:` section: time a run by a grid carbon-intensity forecast (accounting/forecast.py,
accounting/timing.py; docs/green.md). Kept apart from config/__init__.py, which only holds the field."""

from __future__ import annotations

from datetime import date
from typing import Annotated, Literal, Optional, Union

from pydantic import BeforeValidator, Field

from ecotrain.config.base import Section
from ecotrain.base.userpath import user_path

FORECAST_FILE = "give a forecast file: Carbon Aware SDK or ElectricityMaps JSON, or a CSV of time,gCO2e/kWh rows"


def _iso_text(v):
    """A time as its ISO text: YAML reads an unquoted `2026-12-05T06:00:00Z` (a recipe's, or an override's
    `carbon.deadline=...`) as a datetime, and `2026-12-05` as a date; the fields hold the text."""
    return v.isoformat() if isinstance(v, date) else v  # a datetime is a date too


IsoText = Annotated[str, BeforeValidator(_iso_text)]


class SimulatedClock(Section):
    """A clock for tests and benches, explicit in the config: it starts at `start` (ISO time), every
    training step takes `seconds_per_step`, and a wait passes at once (no real sleep). The run's
    training is the same; only when it is said to happen changes."""

    start: IsoText = Field(min_length=1)
    seconds_per_step: float = Field(gt=0)


class CarbonConfig(Section):
    """`fit --carbon-forecast FILE [--deadline T]` sets `forecast` and `deadline`."""

    forecast: Optional[str] = None  # a forecast file: Carbon Aware SDK or ElectricityMaps JSON, or CSV time,g/kWh
    deadline: Optional[IsoText] = None  # ISO time, or a duration from the run's first start (90m, 12h, 2d)
    threshold: Optional[float] = Field(None, ge=0)  # g/kWh: train whenever the forecast is at or below it
    check_every: int = Field(8, gt=0)  # steps between clock reads (a real clock)
    clock: Union[Literal["real"], SimulatedClock] = "real"


def cli_overrides(forecast: Optional[str], deadline: Optional[str]) -> list[str]:
    """`--carbon-forecast FILE [--deadline T]` (fit, green) as dotted overrides of the `carbon:` section."""
    from ecotrain.base.errors import ConfigError

    if deadline and not forecast:
        raise ConfigError("--deadline: only with --carbon-forecast FILE (the deadline is met by the forecast's "
                          "cleanest hours)")
    if not forecast:
        return []
    path = user_path(forecast, "--carbon-forecast", FORECAST_FILE)  # before any run folder; a FIFO would block
    out = [f"carbon.forecast={path.resolve()}"]  # absolute: a resumed run finds it from anywhere
    return out + ([f"carbon.deadline={deadline}"] if deadline else [])
