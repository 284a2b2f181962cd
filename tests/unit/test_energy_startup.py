"""energy.py: CodeCarbon's own start-up is the meter's cost, not the run's. `prepare()` probes the
hardware in a background thread; `start()` waits for it and starts the tracker, so CodeCarbon's span
begins where the ledger's clocks do, and the start-up is reported beside the figure, never in it."""

from __future__ import annotations

import time

from ecotrain.accounting import energy
from ecotrain.accounting.energy import EnergyMeter


def meter():
    return EnergyMeter(pue=1.0, tracking_mode="process", sample_seconds=0.5)


def test_prepare_returns_at_once_and_the_start_up_stays_out_of_the_figure():
    m = meter()
    t0 = time.perf_counter()
    m.prepare()
    assert time.perf_counter() - t0 < 0.2  # CodeCarbon's probes take a second or more
    m.start()  # waits for the probes, then starts here: the span begins now
    begun = time.perf_counter()
    assert m.reason is None, m.reason
    assert m.startup_wait is not None and m.startup_cpu is not None
    time.sleep(1.0)
    assert m.live_kwh() is not None
    e = m.stop()
    assert e["kwh"] > 0 and e["missing_reason"] is None
    assert e["startup_seconds"] == 0.0 and e["startup_kwh"] == 0.0
    assert e["meter_startup"]["counted"] is False and e["meter_startup"]["wait_seconds"] >= 0
    assert "not counted" in e["how"]
    assert abs(m._requested - begun) < 0.2  # CodeCarbon's span starts where the run's does


def test_a_run_that_never_started_has_no_figure_and_says_why():
    m = meter()
    m.prepare()
    e = m.stop()  # prepared, never started (a failure before the first step)
    assert e["kwh"] is None and "before training started" in e["missing_reason"]


def test_a_failed_background_start_is_reported(monkeypatch):
    from codecarbon.emissions_tracker import BaseEmissionsTracker

    def boom(self, *a, **k):
        raise RuntimeError("no power sensors")

    monkeypatch.setattr(BaseEmissionsTracker, "_ensure_hardware_ready", boom)
    m = meter()
    m.prepare()
    m.start()
    assert m.live_kwh() is None
    e = m.stop()
    assert e["kwh"] is None and "did not start" in e["missing_reason"] and "no power sensors" in e["missing_reason"]


def test_grid_data_read_directly_matches_codecarbons():
    from codecarbon.input import DataSource

    assert energy.world_average() == float(DataSource().get_carbon_intensity_per_source_data()["world_average"])
    assert energy._energy_mix() == DataSource().get_global_energy_mix_data()


def test_a_codecarbon_without_the_grid_argument_still_meters(monkeypatch):
    """The meter gives CodeCarbon the grid (`force_carbon_intensity_g_co2e_kwh`) so its unused CO2e
    figure loads no tables; a CodeCarbon without that argument still starts and measures."""
    import codecarbon

    class Older(codecarbon.OfflineEmissionsTracker):
        def __init__(self, *a, **k):
            if "force_carbon_intensity_g_co2e_kwh" in k:
                raise TypeError("__init__() got an unexpected keyword argument 'force_carbon_intensity_g_co2e_kwh'")
            super().__init__(*a, **k)

    monkeypatch.setattr(codecarbon, "OfflineEmissionsTracker", Older)
    m = meter()
    m.start()
    assert type(m.tracker) is Older and m.reason is None, m.reason
    time.sleep(0.6)
    e = m.stop()
    assert e["kwh"] > 0 and e["missing_reason"] is None
