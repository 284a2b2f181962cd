"""energy.py off the critical path: CodeCarbon starts in a background thread, and the seconds before
it is up are estimated and labelled, never silently dropped or passed off as measured."""

from __future__ import annotations

import time

import pytest

from ecotrain.accounting import energy
from ecotrain.accounting.energy import EnergyMeter


def meter():
    return EnergyMeter(pue=1.0, tracking_mode="process", sample_seconds=0.5)


def test_start_returns_at_once_and_the_start_up_is_estimated_and_labelled():
    m = meter()
    t0 = time.perf_counter()
    m.start()
    assert time.perf_counter() - t0 < 0.2  # CodeCarbon's probes take a second or more
    m.wait()
    assert m.reason is None, m.reason
    assert m.startup_seconds > 0
    live = m.live_kwh()
    assert live is not None and live > 0
    time.sleep(1.2)
    end = time.perf_counter()
    e = m.stop()
    assert e["kwh"] > 0 and e["missing_reason"] is None
    assert e["startup_seconds"] == pytest.approx(m.startup_seconds)
    assert 0 < e["startup_kwh"] < e["kwh"]
    assert "while CodeCarbon started, estimated at its mean power" in e["how"]
    assert e["method"] == "estimated"
    assert sum(e["components_kwh"].values()) == pytest.approx(e["kwh"] * 1.0, rel=1e-6)  # pue 1: parts add up
    # the whole span start() .. stop() at the mean power CodeCarbon measured over its part
    covered = end - t0 - e["startup_seconds"]
    assert e["startup_kwh"] / e["kwh"] == pytest.approx(e["startup_seconds"] / (e["startup_seconds"] + covered),
                                                        rel=0.05)


def test_a_run_shorter_than_the_start_is_estimated_whole_and_says_so():
    m = meter()
    m.start()
    e = m.stop()  # before CodeCarbon is up: waits for it, then stops
    assert e["kwh"] is not None and e["kwh"] == pytest.approx(e["startup_kwh"])
    assert "CodeCarbon was up only after the run" in e["how"] and e["method"] == "estimated"


def test_a_failed_background_start_is_reported(monkeypatch):
    from codecarbon.emissions_tracker import BaseEmissionsTracker

    def boom(self, *a, **k):
        raise RuntimeError("no power sensors")

    monkeypatch.setattr(BaseEmissionsTracker, "_ensure_hardware_ready", boom)
    m = meter()
    m.start()
    assert m.live_kwh() is None  # waits for the thread, then knows
    e = m.stop()
    assert e["kwh"] is None and "did not start" in e["missing_reason"] and "no power sensors" in e["missing_reason"]


def test_grid_data_read_directly_matches_codecarbons():
    from codecarbon.input import DataSource

    assert energy.world_average() == float(DataSource().get_carbon_intensity_per_source_data()["world_average"])
    assert energy._energy_mix() == DataSource().get_global_energy_mix_data()
