"""The energy meter's saved hardware plan through the real CLI: a damaged or hand-made file never
stops a run nor reaches its figure; the next probe replaces it, and the run after reuses it."""

from __future__ import annotations

import json
import os

import pytest

from conftest import ROOT, run_cli
from ecotrain.accounting import meter_plan

FIT = (ROOT / "recipes" / "mnist1d_cnn.yaml", "data.num_samples=300", "loop.max_steps=2", "loop.eval_every=2",
       "--quiet", "--overwrite")


def energy_of(run) -> dict:
    return json.loads((run / "ledger.json").read_text())["energy"]


@pytest.mark.parametrize("damage", ["truncated", "tdp-zero", "nan"])
def test_a_damaged_plan_file_is_probed_over_and_the_next_run_reuses_the_new_one(tmp_path, damage):
    if any(os.path.exists(p) for p in meter_plan._GPU_NODES):
        pytest.skip("a GPU machine always probes (meter_plan.py)")
    env = {"ECOTRAIN_CACHE": str(tmp_path / "cache")}
    first = run_cli("fit", *FIT, "--run-dir", tmp_path / "a", env=env)
    assert first.returncode == 0, first.stderr
    files = list((tmp_path / "cache" / "meter").glob("hardware-*.json"))
    assert len(files) == 1 and energy_of(tmp_path / "a")["meter_startup"]["hardware"] == "probed"
    good = files[0].read_text()
    if damage == "truncated":
        files[0].write_text(good[: len(good) // 2])
    else:  # a hand edit that would change the figure: a TDP of 0 W, or NaN
        obj = json.loads(good)
        cpu = next(s for s in obj["plan"]["hardware_specs"] if s["kind"] == "cpu")
        cpu["tdp"] = 0 if damage == "tdp-zero" else float("nan")
        files[0].write_text(json.dumps(obj))
    second = run_cli("fit", *FIT, "--run-dir", tmp_path / "b", env=env)
    assert second.returncode == 0 and "Traceback" not in second.stderr, second.stderr
    e = energy_of(tmp_path / "b")
    assert e["meter_startup"]["hardware"] == "probed" and e["kwh"] > 0
    assert json.loads(files[0].read_text()) == json.loads(good)  # the probe's answer replaced the damage
    third = run_cli("fit", *FIT, "--run-dir", tmp_path / "c", env=env)
    assert third.returncode == 0, third.stderr
    e3 = energy_of(tmp_path / "c")
    assert e3["meter_startup"]["hardware"] == "cached" and e3["how"].split("; from")[0] == e["how"].split("; from")[0]
    assert e3["notes"] == e["notes"]
