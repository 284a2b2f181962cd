"""`ecotrain green` end to end on a tiny schedule: the search, the check on another design seed, the
confirmation on fresh seeds with compare's verdict, the payback line, green.yaml that `ecotrain fit`
runs; and a search stopped by a real SIGTERM in the middle of a trial that, run again, resumes to the
same trials and the same choice."""

import json

from conftest import run_cli
from ecotrain.cli import main
from tests.helpers.runs import write_recipe

TINY = {"name": "tiny", "data": {"name": "digits", "batch_size": 32, "val_split": 0.2},
        "model": {"name": "mlp", "kwargs": {"hidden": [16]}}, "optim": {"lr": 0.01},
        "loop": {"max_steps": 60, "max_epochs": None, "log_every": 10, "eval_every": 15},
        "logging": {"progress": "off"}, "ledger": {"energy": "off"}}
SEARCH = ["--tolerance", "0.3", "--margin", "0", "--levers", "schedule,batch", "--trials", "3"]


def test_green_finds_confirms_and_writes_a_runnable_recipe(tmp_path, capsys):
    recipe, out = write_recipe(tmp_path, TINY), tmp_path / "g"
    code = main(["green", str(recipe), *SEARCH, "--check-seeds", "1", "--seeds-confirm", "10,11", "--out", str(out),
                 "--until-decided", "--max-seeds", "4"])
    text = capsys.readouterr().out
    assert code in (0, 1), text  # PASS, or FAIL (or INCONCLUSIVE at the cap)
    g = json.loads((out / "green.json").read_text())
    trials = json.loads((out / "trials.json").read_text())
    assert g["verdict"] in ("PASS", "FAIL", "INCONCLUSIVE") and f"verdict: {g['verdict']}" in text
    seeds = g["decision"]["seeds"]  # fresh seeds from 10 on, one more per look, never a design seed
    assert seeds == list(range(10, 10 + len(seeds))) and 2 <= len(seeds) <= 4 and g["decision"]["looks"] == len(seeds) - 1
    assert len(seeds) == 4 or g["verdict"] != "INCONCLUSIVE"
    assert f"decision: {g['verdict']} after {len(seeds)} seeds per side" in text
    assert g["design_cost_ratio"] < 1 and g["check_seeds"] == [1] and g["check_deficit"] <= 0.3
    assert "pays back after" in text or "never pays back" in text
    # the search's cost is every run's ledger: baseline, trials (pruned too), check runs, confirmation
    runs = [out / "baseline", *(out / "trials").iterdir(), *(out / "check").iterdir(),
            *(p for p in (out / "confirm").iterdir() if p.is_dir())]
    flops = sum(json.loads((r / "ledger.json").read_text())["flops"]["total"] for r in runs)
    base = json.loads((out / "baseline" / "ledger.json").read_text())["flops"]["total"]
    assert abs(g["total_cost_baselines"] - flops / base) < 1e-6
    assert len(trials["trials"]) >= 3 and (out / "trials.csv").read_text().startswith("trial,state,cost_ratio")
    html = (out / "green.html").read_text()
    assert "Content-Security-Policy" in html and "data:image/png;base64," in html and "Pareto" in html
    assert "paired by seed" in (out / "verdict.txt").read_text()
    # green.yaml is a recipe: it trains as it is
    assert main(["fit", str(out / "green.yaml"), "--run-dir", str(tmp_path / "again"), "--quiet"]) == 0
    chosen = trials["trials"][g["chosen"]]
    assert json.loads((tmp_path / "again" / "summary.json").read_text())["steps"] == \
        json.loads((out / "trials" / f"t{g['chosen']:03d}" / "summary.json").read_text())["steps"]
    assert chosen["feasible"]


def test_a_search_killed_mid_trial_resumes_to_the_same_trials(tmp_path, capsys):
    recipe, marker = write_recipe(tmp_path, TINY), tmp_path / "killed-once"
    kill = f"callbacks=[{{path: tests.helpers.green_kill:KillOnceIn, kwargs: {{run: t000, step: 3, marker: '{marker}'}}}}]"
    cmd = ["green", recipe, kill, *SEARCH[:-1], "2", "--check-seeds", "none", "--seeds-confirm", "0"]  # 2 trials
    r = run_cli(*cmd, "--out", tmp_path / "B")
    assert r.returncode == 75 and marker.exists(), r.stderr  # SIGTERM in trial 0: checkpointed, exit 75
    assert "run the same `ecotrain green` command again" in r.stderr
    r = run_cli(*cmd, "--out", tmp_path / "B")  # the same command: resumes trial 0 where it stopped
    assert r.returncode == 0, r.stderr
    assert main([*map(str, cmd), "--out", str(tmp_path / "A")]) == 0  # uninterrupted (the marker is there now)
    capsys.readouterr()
    rows = {k: json.loads((tmp_path / k / "trials.json").read_text()) for k in "AB"}
    strip = lambda d: [(t["trial"], t["state"], t["params"], t["flops"], t["val"]) for t in d["trials"]]  # noqa: E731
    assert strip(rows["A"]) == strip(rows["B"]) and rows["A"]["chosen"] == rows["B"]["chosen"]
    costs = {k: json.loads((tmp_path / k / "green.json").read_text())["costs"] for k in "AB"}
    assert [c for c in costs["A"] if c.startswith("calibration")] == [c for c in costs["B"] if c.startswith("calibration")]
    segments = json.loads((tmp_path / "B" / "trials" / "t000" / "ledger.json").read_text())["segments"]
    assert segments == 2  # trial 0 really was stopped and resumed, not retrained
