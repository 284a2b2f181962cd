"""`ecotrain green` ranks by measured energy by default: each trial is timed against a calibration probe
of the baseline trained just before it (A, B), the probes are in the search's cost, and the ratio is the
trial's CPU-time based energy over the baseline's under the probe's load factor."""

import json
import statistics

from ecotrain.accounting.energy import cpu_time_kwh
from ecotrain.cli import main
from tests.helpers.runs import write_recipe

TINY = {"name": "tiny", "data": {"name": "digits", "batch_size": 32, "val_split": 0.2},
        "model": {"name": "mlp", "kwargs": {"hidden": [16]}}, "optim": {"lr": 0.01},
        "loop": {"max_steps": 60, "max_epochs": None, "log_every": 10, "eval_every": 15},
        "logging": {"progress": "off"}}


def test_green_by_energy_pairs_each_trial_with_a_probe_of_the_baseline(tmp_path, capsys):
    recipe, out = write_recipe(tmp_path, TINY), tmp_path / "g"
    main(["green", str(recipe), "--tolerance", "1", "--margin", "0", "--levers", "schedule", "--trials", "1",
          "--check-seeds", "none", "--seeds-confirm", "0", "--out", str(out), "--calibrate", "0.5",
          "--plan-region", "SE"])
    text = capsys.readouterr().out
    trials = json.loads((out / "trials.json").read_text())
    g = json.loads((out / "green.json").read_text())
    assert g["by"] == "energy" and "calibration probes (4)" in g["costs"]
    probes = sorted(p.name for p in (out / "probes").iterdir())
    assert probes == ["p000", "reference", "reference-2", "reference-3"]
    kwh = {p: cpu_time_kwh(json.loads((out / "probes" / p / "ledger.json").read_text())) for p in probes}
    row = trials["trials"][0]
    base = cpu_time_kwh(json.loads((out / "baseline" / "ledger.json").read_text()))
    reference = statistics.median(kwh[p] for p in probes if p.startswith("reference"))  # the median of three
    assert abs(row["cost_ratio"] - row["cost"] / (base * kwh["p000"] / reference)) < 1e-9
    assert "pays back after" in text or "never pays back" in text
    # the plan: model and data measured, region / timing / spot modelled, summed into CO2e and money
    plan = json.loads((out / "plan.json").read_text())
    fams = {f["family"]: f for f in plan["families"]}
    assert list(fams) == ["model and data", "grid region", "carbon-aware timing", "spot capacity"]
    assert fams["model and data"]["kind"] == "measured" and fams["grid region"]["co2e"] < 1  # Sweden's grid
    spot = fams["spot capacity"]
    assert spot["restart_seconds"] > 0 and abs(spot["money"] - 0.35 * (1 + spot["overhead"])) < 1e-12
    model_co2e = fams["model and data"]["co2e"]["ratio"]
    assert abs(plan["total"]["co2e"]["ratio"] - model_co2e * fams["grid region"]["co2e"] * spot["co2e"]) < 1e-9
    assert "| total co2e |" in (out / "plan.md").read_text() and "three families" in (out / "green.html").read_text()


def test_the_fitted_cost_model_predicts_trials_before_they_train_once_enough_were_measured(tmp_path, capsys):
    # long enough that every trial's CPU time is a measurable figure (the ledger counts it in 10 ms):
    # a trial measured at zero has no ratio the model can fit
    recipe = write_recipe(tmp_path, {**TINY, "loop": {**TINY["loop"], "max_steps": 600, "eval_every": 150}})
    out = tmp_path / "g"
    main(["green", str(recipe), "--tolerance", "1", "--margin", "0", "--levers", "schedule", "--trials", "10",
          "--check-seeds", "none", "--seeds-confirm", "0", "--out", str(out), "--calibrate", "0"])
    text = capsys.readouterr().out
    rows = json.loads((out / "trials.json").read_text())["trials"]
    g = json.loads((out / "green.json").read_text())
    trained = [r for r in rows if r["state"] != "skipped"]
    assert all(r["predicted_ratio"] is None for r in trained[:5])  # a guess never prunes: 5 measured first
    predicted = [r for r in rows if r["predicted_ratio"] is not None]
    assert predicted and all(r["predicted_ratio"] > 0 for r in predicted)  # 10 trials on one lever: it speaks
    assert g["cost_model"]["predicted"] == sum(r["state"] == "complete" for r in predicted)
    assert "fitted cost model:" in text
    for r in rows:
        if r["state"] == "skipped":  # skipped only when the model's cheap end is no cheaper than the best so far
            best = min(x["cost_ratio"] for x in rows[:r["trial"]] if x["feasible"])
            cheap = float(r["note"].split("cheap end: ")[1].rstrip("x)"))
            assert cheap >= best
