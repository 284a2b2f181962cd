"""memory.budget end to end: `fit` measures in real subprocesses, trains with the choice, records it,
and a resume reads it back; `plan --budget` prints the measured plans, and one line when none fits."""

import json

from ecotrain.report import build_report

TINY = ["data.kwargs.seq_len=128", "data.kwargs.max_bytes=60000", "model.kwargs.d_model=32", "model.kwargs.n_layers=2",
        "model.kwargs.n_heads=2", "data.batch_size=4", "loop.eval_every=null", "ledger.energy=off", "precision=fp32"]


def test_fit_with_a_budget_records_the_choice_and_resume_reuses_it(cli, tmp_path):
    run = tmp_path / "run"
    r = cli("fit", "recipes/charlm_long.yaml", *TINY, "loop.max_steps=3", "memory.budget=64GiB", "--run-dir", run,
            "--quiet")
    assert r.returncode == 0, r.stderr
    rec = json.loads((run / "memory_plan.json").read_text())
    assert rec["budget_bytes"] == 64 * 2**30 and len(rec["measured"]) == 1  # the baseline fits: nothing else measured
    chosen = rec["chosen"]
    assert chosen["checkpointing"] == "off" and chosen["micro_batches"] == 1 and chosen["fits"]
    assert 50 * 2**20 < chosen["peak_bytes"] < rec["usable_bytes"] and chosen["step_seconds"] > 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["memory_plan"] == rec
    # the user's config stays as written (checkpointing `all`, the budget); the plan is applied on top
    assert "budget: 68719476736" in (run / "config.yaml").read_text()
    r = cli("resume", run, "loop.max_steps=5", "--allow-config-change", "--quiet")
    assert r.returncode == 0, r.stderr
    assert "not measured again" in r.stderr and "chosen in" not in r.stderr
    # the checkpoint holds the config with the plan applied; the resume applies the same plan: no other change
    assert "loop.max_steps: 3 -> 5" in r.stderr and "activation_checkpointing" not in r.stderr
    assert json.loads((run / "memory_plan.json").read_text())["search_seconds"] == rec["search_seconds"]
    assert json.loads((run / "summary.json").read_text())["steps"] == 5
    html = build_report([[str(run)]]).read_text()  # the run's report shows the plans and the choice
    assert 'id="memory-plan"' in html and "no checkpointing, 1 micro-batch of 4, fp32" in html


def test_plan_budget_none_fits_prints_the_plans_and_one_line(cli, tmp_path):
    page = tmp_path / "plan.html"
    r = cli("plan", "recipes/charlm_long.yaml", *TINY, "--budget", "2MiB", "--out", page)
    assert r.returncode == 1, r.stderr
    lines = r.stdout.splitlines()
    assert any("no checkpointing, 1 micro-batch of 4, fp32" in ln and "over" in ln for ln in lines)
    # a more frugal plan was measured too (which one depends on the peaks predicted from the measured
    # baseline), with its measured and predicted peaks, and it does not fit either
    rows = [ln for ln in lines[:-2] if ln.endswith("over") and "fp32" in ln]
    frugal = [ln for ln in rows if "micro-batches of" in ln or "checkpointing" in ln.split(",")[0].replace("no ch", "")]
    assert len(rows) >= 2 and frugal and all(ln.split("fp32")[1].count("MiB") == 3 for ln in rows), lines  # peak, +eval, predicted
    last = lines[-2]
    assert last.startswith("memory.budget=2 MiB: no plan fits") and "smallest peak measured" in last
    assert "sharding" in last or "smaller data.batch_size" in last
    html = page.read_text()
    assert lines[-1] == f"page: {page}" and "Pareto front" in html and "data:image/png" in html


def test_plan_budget_bad_value_is_one_line(cli):
    r = cli("plan", "recipes/charlm_long.yaml", "--budget", "lots")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "memory.budget" in r.stderr and "2GiB" in r.stderr
