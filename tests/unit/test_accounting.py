"""The cost ledger on tiny runs: exact FLOPs, budgets that stop at the right step, energy that is
missing for a stated reason, live cost in the log records, resume."""

import json
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ecotrain import fit
from ecotrain.accounting.energy import country_intensity, country_iso3, co2e_intensity
from ecotrain.accounting.flops import count_flops
from ecotrain.accounting.prices import price_for
from ecotrain.base.errors import ConfigError

# digits: 64 inputs, 10 classes; tiny_cfg's MLP has one hidden layer of 32
IN, H, OUT = 64, 32, 10
FWD = 2 * (IN * H + H * OUT)  # per sample: two matmuls (addmm: the bias add is not a FLOP by convention)
# backward per sample: the weight gradient of both layers, the input gradient of the second only
# (the first layer's input needs no gradient)
BWD = 2 * IN * H + 2 * H * OUT + 2 * H * OUT


def ledger_of(run_dir):
    return json.loads((run_dir / "ledger.json").read_text())


def test_mlp_flops_equal_the_hand_count():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(IN, H), nn.ReLU(), nn.Linear(H, OUT))
    x, y = torch.randn(32, IN), torch.randint(0, OUT, (32,))
    f = count_flops(model, lambda: F.cross_entropy(model(x), y).backward(), samples=32)
    assert f.forward == 32 * FWD == 151_552
    assert f.total == 32 * (FWD + BWD) == 323_584
    assert f.per_sample == FWD + BWD and f.forward_per_sample == FWD


def test_ledger_accounts_measured_flops_per_sample_trained_and_evaluated(tiny_cfg, tmp_path):
    r = fit(tiny_cfg(**{"ledger.energy": "off"}), run_dir=tmp_path)
    L = ledger_of(tmp_path)
    f = L["flops"]
    assert f["measured_step_flops"] == 32 * (FWD + BWD) and f["measured_step_samples"] == 32
    assert f["train"] == (FWD + BWD) * r.state.samples_seen  # per sample: the epoch's last batch is short
    assert r.state.samples_seen < 60 * 32 and L["samples"] == r.state.samples_seen
    n_val = f["eval_samples_per_pass"]
    assert n_val > 0 and f["eval_passes"] == 3  # eval_every 20 over 60 steps
    assert f["eval"] == FWD * n_val * 3 and f["total"] == f["train"] + f["eval"]
    assert L["steps"] == 60 and L["stopped_because"] == "max_steps" and L["segments"] == 1
    assert L["wall_seconds"] > 0 and L["cpu_seconds"] > 0
    assert L["device_hours"] == {"cpu": pytest.approx(L["wall_seconds"] / 3600 * torch.get_num_threads())}
    assert L["cost"]["amount"] == pytest.approx(L["device_hours"]["cpu"] * 0.04)
    assert L["energy"]["kwh"] is None and L["energy"]["missing_reason"] == "ledger.energy=off"
    assert L["co2e"]["kg"] is None and "energy" in L["co2e"]["missing_reason"]
    assert "ledger" not in r.summary  # ledger.json holds it, once


def test_flops_budget_stops_before_a_step_it_cannot_afford(tiny_cfg, tmp_path):
    step = 32 * (FWD + BWD)
    cfg = tiny_cfg(**{"ledger.energy": "off", "budget.max_flops": 10.5 * step, "loop.max_steps": 100,
                      "loop.eval_every": None})  # no evaluation inside the first epoch (38 steps)
    r = fit(cfg, run_dir=tmp_path / "a")
    L = ledger_of(tmp_path / "a")
    assert r.state.step == 10 and r.summary["stopped_because"] == "budget:max_flops"
    assert L["flops"]["total"] == 10 * step <= 10.5 * step and L["budget"]["stopped_by"] == "max_flops"
    r = fit(cfg.model_copy(update={"budget": cfg.budget.model_copy(update={"max_flops": 10.0 * step})}),
            run_dir=tmp_path / "b")
    assert r.state.step == 10  # exactly affordable: spent to the last FLOP


def test_flops_budget_counts_evaluation(tiny_cfg, tmp_path):
    step = 32 * (FWD + BWD)
    cfg = tiny_cfg(**{"ledger.energy": "off", "budget.max_flops": 30.5 * step, "loop.max_steps": 100,
                      "loop.eval_every": 10})
    r = fit(cfg, run_dir=tmp_path)
    L = ledger_of(tmp_path)
    assert r.summary["stopped_because"] == "budget:max_flops"
    assert L["flops"]["total"] <= 30.5 * step and r.state.step < 30  # evaluations took their share


def test_wall_budget_is_checked_every_8_steps(tiny_cfg, tmp_path):
    cfg = tiny_cfg(**{"ledger.energy": "off", "budget.max_wall_seconds": 0.3, "loop.max_steps": 100_000,
                      "loop.eval_every": None, "data.val_split": 0.0})
    r = fit(cfg, run_dir=tmp_path)
    L = ledger_of(tmp_path)
    assert r.summary["stopped_because"] == "budget:max_wall_seconds"
    assert r.state.step % 8 == 0 or r.state.batch_in_epoch == 0  # every 8 steps, and at each epoch end
    assert 0.3 <= L["wall_seconds"] < 3.0


def test_cost_budget(tiny_cfg, tmp_path):
    cfg = tiny_cfg(**{"ledger.energy": "off", "budget.max_cost": 1e-12, "ledger.prices": {"cpu": 1.0},
                      "loop.max_steps": 1000})
    r = fit(cfg, run_dir=tmp_path)
    assert r.summary["stopped_because"] == "budget:max_cost" and r.state.step == 8
    assert ledger_of(tmp_path)["cost"]["source"] == "ledger.prices"


def test_energy_budget_and_live_cost_in_records(tiny_cfg, tmp_path):
    cfg = tiny_cfg(**{"budget.max_energy_kwh": 1e-12, "loop.max_steps": 1000, "loop.log_every": 5,
                      "ledger.country": "SE", "ledger.sample_seconds": 0.5})
    r = fit(cfg, run_dir=tmp_path)
    L = ledger_of(tmp_path)
    assert r.summary["stopped_because"] == "budget:max_energy_kwh" and r.state.step == 5
    assert L["energy"]["kwh"] > 0 and L["energy"]["method"] == "estimated"  # no RAPL/NVML here
    assert "cpu estimated" in L["energy"]["how"] and L["energy"]["components_method"]["cpu"] == "estimated"
    assert L["co2e"]["grid"] == "SWE"
    assert L["co2e"]["kg"] == pytest.approx(L["energy"]["kwh"] * L["co2e"]["g_per_kwh"] / 1000)
    rec = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()][0]
    assert rec["step"] == 5 and rec["energy_kwh"] > 0 and rec["co2e_g"] > 0 and rec["flops"] == 5 * 32 * (FWD + BWD)
    assert set(r.state.progress_fields) == {"kWh", "gCO2e"}


def test_forecast_after_the_first_epoch_warns(tiny_cfg, tmp_path, ecotrain_log):
    step = 32 * (FWD + BWD)
    cfg = tiny_cfg(**{"ledger.energy": "off", "budget.max_flops": 50 * step, "loop.max_steps": 80,
                      "loop.eval_every": None, "data.val_split": 0.0})
    r = fit(cfg, run_dir=tmp_path)
    err = ecotrain_log.text
    assert "forecast" in err and "budget.max_flops" in err
    fc = ledger_of(tmp_path)["forecast"]
    assert fc["planned_steps"] == 80 and fc["over_budget"][0]["budget"] == "max_flops"
    assert fc["method"].startswith("forecast: linear extrapolation")
    assert r.state.step == 50 and abs(fc["over_budget"][0]["stops_near_step"] - 50) <= 1


def test_codecarbon_missing_still_trains_and_says_why(tiny_cfg, tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "codecarbon" or m.startswith("codecarbon.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "codecarbon", None)  # import codecarbon -> ImportError
    r = fit(tiny_cfg(**{"loop.max_steps": 20}), run_dir=tmp_path)
    L = ledger_of(tmp_path)
    assert r.state.step == 20 and L["flops"]["total"] > 0
    assert L["energy"]["kwh"] is None and "CodeCarbon is not available" in L["energy"]["missing_reason"]
    assert L["co2e"]["kg"] is None


@pytest.mark.parametrize("where", ["start", "stop", "zero"])
def test_codecarbon_failing_silently_is_detected(tiny_cfg, tmp_path, monkeypatch, where):
    from codecarbon.emissions_tracker import BaseEmissionsTracker

    def boom(self, *a, **k):
        raise RuntimeError("no power sensors")

    target = {"start": "_ensure_hardware_ready", "stop": "_prepare_emissions_data", "zero": "_do_measurements"}[where]
    monkeypatch.setattr(BaseEmissionsTracker, target, boom if where != "zero" else lambda self: None)
    r = fit(tiny_cfg(**{"loop.max_steps": 20}), run_dir=tmp_path)
    e = ledger_of(tmp_path)["energy"]
    assert r.state.step == 20 and e["kwh"] is None
    expected = {"start": "did not start", "stop": "failed at stop", "zero": "reported 0"}[where]
    assert expected in e["missing_reason"], e["missing_reason"]
    if where != "zero":
        assert "no power sensors" in e["missing_reason"]  # what CodeCarbon only logged


def test_resume_adds_segments(tiny_cfg, tmp_path):
    cfg = tiny_cfg(**{"ledger.energy": "off", "loop.max_steps": 30, "loop.eval_every": None})
    first = fit(cfg, run_dir=tmp_path)
    a = ledger_of(tmp_path)
    cfg2 = cfg.model_copy(update={"loop": cfg.loop.model_copy(update={"max_steps": 50})})
    fit(cfg2, run_dir=tmp_path, resume=first.state.last_checkpoint, allow_config_change=True)
    b = ledger_of(tmp_path)
    assert b["segments"] == 2 and b["steps"] == 50 and b["wall_seconds"] > a["wall_seconds"]
    assert b["flops"]["train"] == (FWD + BWD) * b["samples"]


def test_resuming_a_finished_run_keeps_its_flops(tiny_cfg, tmp_path):
    """A job restarted after its run finished (`fit --resume auto`, `resume`) trains no step: the run is
    finished, so nothing is rewritten (its ledger.json once said `flops: null`, losing the run's count);
    a resume that extends the budget is a new segment that keeps the count."""
    cfg = tiny_cfg(**{"ledger.energy": "off", "loop.max_steps": 20, "loop.eval_every": None})
    first = fit(cfg, run_dir=tmp_path)
    a, files = ledger_of(tmp_path), {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    again = fit(cfg, run_dir=tmp_path, resume=first.state.last_checkpoint)
    assert again.state is None and again.summary["steps"] == 20  # finished: nothing trained
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == files  # nothing rewritten
    assert all(torch.equal(x, y) for x, y in zip(first.model.state_dict().values(), again.model.state_dict().values()))
    longer = tiny_cfg(**{"ledger.energy": "off", "loop.max_steps": 24, "loop.eval_every": None})
    fit(longer, run_dir=tmp_path, resume=first.state.last_checkpoint, allow_config_change=True)
    c = ledger_of(tmp_path)
    assert c["segments"] == 2 and c["steps"] == 24 and c["flops"]["total"] > a["flops"]["total"]
    # it read "an earlier segment: an earlier segment: ledger.energy=off" after two resumes
    assert c["energy"]["missing_reason"] == "an earlier segment: ledger.energy=off"


def test_prices_and_grids():
    assert price_for("NVIDIA H100 80GB HBM3") == (4.0, "ecotrain default table")
    assert price_for("NVIDIA H100 80GB HBM3", {"h100": 2.1}) == (2.1, "ledger.prices")
    assert price_for("TPU v9")[0] is None
    assert country_iso3("se") == "SWE" and country_iso3("FRA") == "FRA"
    g_fr, src = country_intensity("FRA")
    assert 20 < g_fr < 150 and "France" in src
    assert co2e_intensity("PL", 300.0)[0] == 300.0 and co2e_intensity(None, None)[1] == "world"
    with pytest.raises(ConfigError, match="XX"):
        country_iso3("XX")


def test_budget_config_is_validated(tiny_cfg):
    with pytest.raises(Exception, match="needs the ledger"):
        tiny_cfg(**{"budget.max_flops": 1e9, "ledger.enabled": False})
    with pytest.raises(Exception, match="needs energy"):
        tiny_cfg(**{"budget.max_co2e_kg": 1.0, "ledger.energy": "off"})


def test_ledger_off_writes_nothing(tiny_cfg, tmp_path):
    fit(tiny_cfg(**{"ledger.enabled": False, "loop.max_steps": 10}), run_dir=tmp_path)
    assert not (tmp_path / "ledger.json").exists()


def test_flops_changed_banks_the_old_rate_and_measures_again(tiny_cfg, tmp_path):
    """A method that changes the per-sample work mid-run (here: the first layer frozen at step 20,
    so its weight gradient is no longer computed) is counted at each rate for the samples trained
    at it; one-off costs (state.add_flops) are listed and added."""
    from ecotrain.callbacks import Callback

    class FreezeFirst(Callback):
        def on_step_end(self, state):
            if state.step == 20:
                self.at = state.samples_seen
                first = next(m for m in state.model.modules() if isinstance(m, nn.Linear))
                first.requires_grad_(False)
                state.flops_changed()
                state.add_flops(1000, "teacher_cache")

    cb = FreezeFirst()
    r = fit(tiny_cfg(**{"ledger.energy": "off", "loop.eval_every": None}), run_dir=tmp_path, callbacks=[cb])
    f = ledger_of(tmp_path)["flops"]
    frozen = FWD + 2 * H * OUT  # backward: the second layer's weight gradient only (no input gradient now)
    assert f["per_train_sample"] == frozen and f["remeasured"] == 1
    assert f["train"] == (FWD + BWD) * cb.at + frozen * (r.state.samples_seen - cb.at)
    assert f["extra"] == {"teacher_cache": 1000.0} and f["total"] == f["train"] + f["eval"] + 1000
