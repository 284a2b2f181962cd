"""The `carbon:` section: time a run by a grid carbon-intensity forecast (accounting/forecast.py,
accounting/timing.py; docs/green.md). Kept apart from config.py, which only holds the field."""

from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import Field

from ecotrain.config_base import Section


class SimulatedClock(Section):
    """A clock for tests and benches, explicit in the config: it starts at `start` (ISO time), every
    training step takes `seconds_per_step`, and a wait passes at once (no real sleep). The run's
    training is the same; only when it is said to happen changes."""

    start: str = Field(min_length=1)
    seconds_per_step: float = Field(gt=0)


class CarbonConfig(Section):
    """`fit --carbon-forecast FILE [--deadline T]` sets `forecast` and `deadline`."""

    forecast: Optional[str] = None  # a forecast file: Carbon Aware SDK or ElectricityMaps JSON, or CSV time,g/kWh
    deadline: Optional[str] = None  # ISO time, or a duration from the run's first start (90m, 12h, 2d)
    threshold: Optional[float] = Field(None, ge=0)  # g/kWh: train whenever the forecast is at or below it
    check_every: int = Field(8, gt=0)  # steps between clock reads (a real clock)
    clock: Union[Literal["real"], SimulatedClock] = "real"


def cli_overrides(forecast: Optional[str], deadline: Optional[str]) -> list[str]:
    """`--carbon-forecast FILE [--deadline T]` (fit, green) as dotted overrides of the `carbon:` section."""
    from ecotrain.errors import ConfigError

    if deadline and not forecast:
        raise ConfigError("--deadline: only with --carbon-forecast FILE (the deadline is met by the forecast's "
                          "cleanest hours)")
    if not forecast:
        return []
    from pathlib import Path

    out = [f"carbon.forecast={Path(forecast).resolve()}"]  # absolute: a resumed run finds it from anywhere
    return out + ([f"carbon.deadline={deadline}"] if deadline else [])
