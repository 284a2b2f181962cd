"""Carbon-intensity forecasts: the three file shapes, a bad file in one line, the cleanest slots that
meet a deadline, and when `plan` says to wait (the run that pauses: tests/integration/test_carbon_timing.py)."""

import json

import pytest

from ecotrain.accounting.forecast import (chosen_slots, intensity_at, iso, parse_deadline, parse_time, plan,
                                          read_forecast)
from ecotrain.accounting.ledger import timed_co2e
from ecotrain.config_carbon import cli_overrides
from ecotrain.errors import ConfigError

T0 = parse_time("2026-12-03T00:00:00Z", "t")
H = 3600.0


def test_carbon_aware_sdk_shape(tmp_path):
    f = tmp_path / "sdk.json"
    f.write_text(json.dumps([{"location": "eastus", "windowSize": 0, "forecastData": [
        {"location": "eastus", "timestamp": "2026-12-03T00:00:00Z", "duration": 60, "value": 400.5},
        {"location": "eastus", "timestamp": "2026-12-03T01:00:00Z", "duration": 60, "value": 120}]}]))
    slots = read_forecast(f)
    assert [(s.start - T0, s.end - T0, s.g_per_kwh) for s in slots] == [(0, H, 400.5), (H, 2 * H, 120.0)]


def test_electricitymaps_shape_and_csv(tmp_path):
    em = tmp_path / "em.json"
    em.write_text(json.dumps({"zone": "DE", "forecast": [
        {"datetime": "2026-12-03T01:00:00.000Z", "carbonIntensity": 300},
        {"datetime": "2026-12-03T00:00:00.000Z", "carbonIntensity": 500}], "updatedAt": "2026-12-02T23:00:00Z"}))
    slots = read_forecast(em)  # sorted by time; the last point lasts as long as the spacing before it
    assert [(s.start - T0, s.end - T0, s.g_per_kwh) for s in slots] == [(0, H, 500.0), (H, 2 * H, 300.0)]
    c = tmp_path / "f.csv"
    c.write_text("time,gCO2e/kWh\n2026-12-03T00:00:00Z,500\n2026-12-03T00:30:00Z,250\n")
    slots = read_forecast(c)
    assert [s.g_per_kwh for s in slots] == [500.0, 250.0] and slots[1].seconds == 1800


@pytest.mark.parametrize("text,msg", [
    ("", "no forecast rows"),
    ("{not json", "not valid JSON"),
    ('{"forecast": []}', "no forecast points"),
    ('{"forecast": [{"datetime": "2026-12-03T00:00:00Z"}]}', "lacks a time .* or a numeric value"),
    ('[{"timestamp": "yesterday", "value": 3}]', "not an ISO 8601 time"),
    ("2026-12-03T00:00:00Z,abc\n2026-12-03T01:00:00Z,xyz\n", "line 2: 'xyz' is not a number"),
    ("2026-12-03T00:00:00Z,5\n2026-12-03T00:00:00Z,6\n", "two points at"),
    ("2026-12-03T00:00:00Z,-5\n", "negative carbon intensity"),
])
def test_a_bad_file_is_one_line(tmp_path, text, msg):
    f = tmp_path / "bad.txt"
    f.write_text(text)
    with pytest.raises(ConfigError, match=msg) as exc:
        read_forecast(f)
    assert "\n" not in str(exc.value)
    with pytest.raises(ConfigError, match="cannot read"):
        read_forecast(tmp_path / "missing.csv")


def slots_of(values, tmp_path):
    f = tmp_path / "h.csv"
    f.write_text("".join(f"{iso(T0 + i * H)},{v}\n" for i, v in enumerate(values)))
    return read_forecast(f)


def test_cleanest_slots_that_meet_the_deadline(tmp_path):
    slots = slots_of([500, 100, 400, 50, 300, 200], tmp_path)  # six hours
    got = chosen_slots(slots, T0, 2 * H, T0 + 6 * H)
    assert [(s.start - T0) / H for s in got] == [1, 3]  # the two cleanest hours
    got = chosen_slots(slots, T0, 2 * H, T0 + 3 * H)  # deadline at 3h: hour 3 is out of reach
    assert [(s.start - T0) / H for s in got] == [1, 2]  # 100 and 400 g, not the 500 g hour
    assert chosen_slots(slots, T0, 4 * H, T0 + 3 * H) == []  # cannot be met: no choice to make
    got = chosen_slots(slots, T0 + 1.5 * H, 0.5 * H, T0 + 6 * H)  # now mid-slot: the rest of hour 1 counts
    assert [(s.start - T0) / H for s in got] == [3]


def test_plan_waits_for_the_clean_hours(tmp_path):
    slots = slots_of([500, 100, 400, 50, 300, 200], tmp_path)
    assert plan(slots, T0, 2 * H, T0 + 6 * H, None) == T0 + H  # wait for hour 1
    assert plan(slots, T0 + H, 2 * H, T0 + 6 * H, None) is None  # in it: train
    assert plan(slots, T0 + 2 * H, H, T0 + 6 * H, None) == T0 + 3 * H  # one hour left: the 50 g one
    assert plan(slots, T0, 6 * H, T0 + 6 * H, None) is None  # every hour is needed: train now
    assert plan(slots, T0, H, None, None) is None  # no deadline, no threshold: the forecast only prices it
    assert plan(slots, T0, H, None, 250) == T0 + H  # threshold alone: the next slot at or below it
    assert plan(slots, T0 + H, H, None, 250) is None
    assert plan(slots, T0, 2 * H, T0 + 6 * H, 450) == T0 + H  # 500 > 450: wait
    assert plan(slots, T0 + 2 * H, 6 * H, T0 + 8 * H, 450) is None  # 400 <= threshold: train
    assert intensity_at(slots, T0 - H) == 500 and intensity_at(slots, T0 + 99 * H) == 200


def test_deadline_and_cli_overrides(tmp_path):
    assert parse_deadline("12h", T0) == T0 + 12 * H and parse_deadline("90m", T0) == T0 + 5400
    assert parse_deadline("2026-12-04T00:00:00Z", 0) == T0 + 24 * H
    with pytest.raises(ConfigError, match="carbon.deadline"):
        parse_deadline("soon", T0)
    with pytest.raises(ConfigError, match="--deadline: only with --carbon-forecast"):
        cli_overrides(None, "12h")
    over = cli_overrides("f.csv", "12h")
    assert over[0].startswith("carbon.forecast=/") and over[1] == "carbon.deadline=12h"


def test_co2e_is_summed_over_the_intervals():
    rec = {"forecast": "f.csv", "g_per_kwh_by_steps": 250.0, "intervals": [
        {"g_per_kwh": 100.0, "kwh": 0.002, "from_step": 0, "to_step": 10},
        {"g_per_kwh": 400.0, "kwh": 0.001, "from_step": 10, "to_step": 15}]}
    got = timed_co2e(rec, 0.003)
    assert got["kg"] == pytest.approx((0.2 + 0.4) / 1000) and got["g_per_kwh"] == pytest.approx(200.0)
    none = timed_co2e({**rec, "intervals": [dict(i, kwh=None) for i in rec["intervals"]]}, None)
    assert none["kg"] is None and none["g_per_kwh"] == 250.0 and "by steps" in none["missing_reason"]


def test_a_real_wait_sleeps_and_a_stop_signal_ends_it(tmp_path):
    import time

    from ecotrain.accounting.timing import CarbonTiming
    from ecotrain.config_carbon import CarbonConfig
    from ecotrain.preemption import Preemption

    stop = Preemption()
    timing = CarbonTiming(CarbonConfig(forecast=str(slots_file(tmp_path))), checkpointer=None, preemption=stop)
    t = time.time()
    assert timing._wait(None, t + 0.3) and time.time() - t >= 0.3  # the real clock really waits
    stop.requested = "SIGTERM"  # what the handler sets
    t = time.time()
    assert not timing._wait(None, t + 30) and time.time() - t < 5  # a stop signal ends the wait at once


def slots_file(tmp_path):
    f = tmp_path / "s.csv"
    f.write_text(f"{iso(T0)},100\n")
    return f
