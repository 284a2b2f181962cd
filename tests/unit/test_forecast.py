"""Carbon-intensity forecasts: the three file shapes, a bad file in one line, the cleanest slots that
meet a deadline, and when `plan` says to wait (the run that pauses: tests/integration/test_carbon_timing.py)."""

import json

import pytest

from ecotrain.accounting.forecast import (chosen_slots, intensity_at, iso, parse_deadline, parse_time, plan,
                                          read_forecast)
from ecotrain.accounting.ledger import timed_co2e
from ecotrain.config.carbon import cli_overrides
from ecotrain.base.errors import ConfigError

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
    with pytest.raises(ConfigError, match="carbon.forecast: .*missing.csv not found; give a forecast file"):
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
    over = cli_overrides(str(slots_file(tmp_path)), "12h")
    assert over[0].startswith("carbon.forecast=/") and over[1] == "carbon.deadline=12h"
    with pytest.raises(ConfigError, match="--carbon-forecast: .*nope.csv not found"):  # before any run folder
        cli_overrides(str(tmp_path / "nope.csv"), "12h")


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
    from ecotrain.config.carbon import CarbonConfig
    from ecotrain.core.preemption import Preemption

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


# ---- inputs that lie (issue 44): NaN or infinite intensities, far-future times, the documented ISO forms ----
@pytest.mark.parametrize("name,text,where", [
    ("nan.csv", "time,g\n2026-12-03T00:00:00Z,100\n2026-12-03T01:00:00Z,nan\n", "nan.csv: line 3"),
    ("inf.csv", "2026-12-03T00:00:00Z,inf\n", "inf.csv: line 1"),
    ("big.csv", "2026-12-03T00:00:00Z,1e400\n", "big.csv: line 1"),
    ("nan.json", '{"forecast": [{"datetime": "2026-12-03T00:00:00Z", "carbonIntensity": 5}, '
                 '{"datetime": "2026-12-03T01:00:00Z", "carbonIntensity": NaN}]}', "nan.json: point 1"),
    ("inf.json", '[{"forecastData": [{"timestamp": "2026-12-03T00:00:00Z", "value": -Infinity}]}]', "inf.json: point 0"),
    ("huge.json", '{"data": [{"datetime": "2026-12-03T00:00:00Z", "carbonIntensity": 1' + "0" * 400 + "}]}",
     "huge.json: point 0"),
])
def test_a_nan_or_infinite_intensity_is_refused_naming_the_file_and_the_row(tmp_path, name, text, where):
    f = tmp_path / name
    f.write_text(text)
    with pytest.raises(ConfigError) as exc:
        read_forecast(f)
    msg = str(exc.value)
    assert msg.startswith(f"{tmp_path / where}: the carbon intensity is ") and "give a finite number" in msg, msg
    assert "\n" not in msg


def test_a_duration_that_is_not_a_positive_number_is_refused(tmp_path):
    f = tmp_path / "d.json"
    f.write_text('{"forecastData": [{"timestamp": "2026-12-03T00:00:00Z", "duration": NaN, "value": 5}]}')
    with pytest.raises(ConfigError, match=r"d.json: point 0: duration nan is not a positive number of minutes"):
        read_forecast(f)


def test_a_year_9999_deadline_is_a_deadline_and_times_past_it_are_one_line(tmp_path):
    end = parse_deadline("9999-12-31T23:59:59Z", T0)
    assert iso(end) == "9999-12-31T23:59:59Z"
    slots = slots_of([500, 100, 400], tmp_path)
    assert plan(slots, T0, H, end, None) == T0 + H  # the cleanest hour, with all the time in the world
    assert iso(end + 3600) == "after 9999-12-31T23:59:59Z"  # a clock run on past it: said, not an error
    assert iso(float("nan")) == "before 0001-01-01T00:00:00Z"
    for text, msg in [("9999-12-31T23:00:00-05:00", "lies outside the years 1 to 9999 in UTC"),
                      ("9" * 400 + "d", "ends past the year 9999; give a shorter duration"),
                      ("2999999999d", "ends past the year 9999")]:
        with pytest.raises(ConfigError, match=msg) as exc:
            parse_deadline(text, T0)
        assert str(exc.value).startswith("carbon.deadline: ") and "\n" not in str(exc.value)


@pytest.mark.parametrize("given,expected", [
    ("2026-12-05T06:00:00Z", "2026-12-05T06:00:00Z"),  # the form parse_time's own message shows
    ("2026-12-05T06:00Z", "2026-12-05T06:00:00Z"),
    ("2026-12-05T06:00", "2026-12-05T06:00:00Z"),  # no zone: UTC
    ("2026-12-05T07:00:00+01:00", "2026-12-05T06:00:00Z"),
    ("2026-12-05", "2026-12-05T00:00:00Z"),
])
def test_the_documented_iso_deadline_forms_are_accepted(tmp_path, given, expected):
    """`--deadline 2026-12-05T06:00:00Z` became a YAML datetime in the override and the config refused it
    ('Input should be a valid string'); a recipe's unquoted deadline and clock start did the same."""
    from ecotrain.config import load_config

    f = slots_file(tmp_path)
    cfg = load_config(None, cli_overrides(str(f), given))
    assert iso(parse_deadline(cfg.carbon.deadline, T0)) == expected
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"carbon: {{forecast: {f}, deadline: {given}, clock: {{start: {given}, seconds_per_step: 1}}}}\n")
    cfg = load_config(recipe)
    assert iso(parse_deadline(cfg.carbon.deadline, T0)) == expected
    assert iso(parse_time(cfg.carbon.clock.start, "carbon.clock.start")) == expected


def test_a_far_future_clock_trains_and_its_ledger_says_when(tiny_cfg, tmp_path):
    """A simulated clock started in the last hour of the year 9999 runs past the last time a date can
    name: the run trains, and the ledger's times say `after 9999-12-31T23:59:59Z` (it raised an
    OverflowError at the first step)."""
    import json

    from ecotrain import fit

    f = tmp_path / "f.csv"
    f.write_text("9999-12-31T22:00:00Z,300\n9999-12-31T23:00:00Z,100\n")
    cfg = tiny_cfg(**{"loop.max_steps": 6, "ledger.energy": "off", "carbon.forecast": str(f),
                      "carbon.deadline": "9999-12-31T23:59:59Z",
                      "carbon.clock": {"start": "9999-12-31T23:00:00Z", "seconds_per_step": 3600}})
    r = fit(cfg, run_dir=tmp_path / "run", quiet=True)
    assert r.summary["steps"] == 6
    co2e = json.loads((tmp_path / "run" / "ledger.json").read_text())["co2e"]
    assert co2e["finished_at"] == "after 9999-12-31T23:59:59Z" and co2e["deadline_met"] is False
    assert co2e["intervals"][0]["start"] == "9999-12-31T23:00:00Z" and co2e["g_per_kwh_by_steps"] == 100.0
