"""`fit --carbon-forecast F --deadline T` on the simulated clock (`carbon.clock`): the run pauses at a
checkpoint outside the cleanest hours, resumes when they come, meets the deadline, pays the forecast's
intensity per interval, and ends with the very weights of a run that never paused, also when a real
SIGTERM stops it mid-way and it is resumed."""

import json
from datetime import datetime, timedelta, timezone

from conftest import run_cli
from ecotrain.cli import main
from tests.helpers.runs import write_recipe

HOURS = [500, 450, 100, 120, 480, 90, 400, 300]  # g/kWh, one per hour from T0
T0 = datetime(2026, 12, 3, tzinfo=timezone.utc)
TINY = {"name": "tiny", "data": {"name": "digits", "batch_size": 32, "val_split": 0.15},
        "model": {"name": "mlp", "kwargs": {"hidden": [16]}}, "optim": {"lr": 0.003},
        "loop": {"max_steps": 40, "max_epochs": None, "log_every": 10, "eval_every": 10},
        "logging": {"progress": "off"}, "ledger": {"energy": "off"}}
CLOCK = 'carbon.clock={start: "2026-12-03T00:00:00Z", seconds_per_step: 360}'  # 40 steps: 4 of the 8 hours


def forecast(tmp_path):
    f = tmp_path / "forecast.csv"
    f.write_text("time,gCO2e/kWh\n" + "".join(f"{(T0 + timedelta(hours=i)).isoformat()},{v}\n"
                                              for i, v in enumerate(HOURS)))
    return f


def fit(recipe, run, *extra):
    """`ecotrain fit` in this process (the killed run below is a real subprocess)."""
    return main(["fit", str(recipe), "--run-dir", str(run), "--quiet", *map(str, extra)])


def test_a_timed_run_pauses_for_clean_hours_and_keeps_its_weights(tmp_path, ecotrain_log):
    recipe, f = write_recipe(tmp_path, TINY), forecast(tmp_path)
    assert fit(recipe, tmp_path / "plain") == 0
    assert fit(recipe, tmp_path / "timed", "--carbon-forecast", f, "--deadline", "8h", CLOCK) == 0
    assert ecotrain_log.text.count("pausing at step") == 3, ecotrain_log.text  # 500 -> 100, 480 -> 90, 400 -> 300
    co2e = json.loads((tmp_path / "timed" / "ledger.json").read_text())["co2e"]
    assert co2e["deadline_met"] and co2e["finished_at"] <= co2e["deadline"] == "2026-12-03T08:00:00Z"
    # the four cleanest hours that fit before the deadline, 10 steps each
    assert [(i["start"][11:16], i["g_per_kwh"], i["to_step"] - i["from_step"]) for i in co2e["intervals"]] == [
        ("02:00", 100.0, 10), ("03:00", 120.0, 10), ("05:00", 90.0, 10), ("07:00", 300.0, 10)]
    assert co2e["g_per_kwh"] == 152.5 and co2e["pauses"] == 3
    same = (tmp_path / "plain" / "model.safetensors").read_bytes() == (tmp_path / "timed" / "model.safetensors").read_bytes()
    assert same, "pausing changed the training"
    # started at once, the same run pays the first four hours' intensity
    assert fit(recipe, tmp_path / "now", "--carbon-forecast", f, CLOCK) == 0
    now = json.loads((tmp_path / "now" / "ledger.json").read_text())["co2e"]
    assert now["pauses"] == 0 and now["g_per_kwh"] == (500 + 450 + 100 + 120) / 4

    # stopped by a real SIGTERM at step 15 (mid-interval), then resumed: the same pauses, intervals and weights
    killer = ["callbacks=[{path: tests.helpers.killer:KillAt, kwargs: {step: 15, sig: SIGTERM}}]"]
    r = run_cli("fit", recipe, "--run-dir", tmp_path / "killed", "--quiet", "--carbon-forecast", f, "--deadline", "8h",
                CLOCK, *killer)
    assert r.returncode == 75, r.stderr
    r = run_cli("resume", tmp_path / "killed", "--quiet")
    assert r.returncode == 0, r.stderr
    again = json.loads((tmp_path / "killed" / "ledger.json").read_text())["co2e"]
    assert again["pauses"] == 3 and again["g_per_kwh"] == 152.5 and again["finished_at"] == co2e["finished_at"]
    assert (tmp_path / "killed" / "model.safetensors").read_bytes() == (tmp_path / "timed" / "model.safetensors").read_bytes()


def test_a_bad_forecast_is_one_line_before_training(tmp_path, capsys):
    recipe = write_recipe(tmp_path, TINY)
    bad = tmp_path / "bad.json"
    bad.write_text('{"zone": "DE"}')
    assert fit(recipe, tmp_path / "run", "--carbon-forecast", bad) != 0
    err = capsys.readouterr().err
    assert "no forecast points" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run" / "checkpoints").exists()
