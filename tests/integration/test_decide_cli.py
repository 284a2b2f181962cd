"""`ecotrain fit CANDIDATE --seeds --baseline BASE --until-decided`: real runs on both sides, paired by
seed, one seed added per look up to --max-seeds, the decision written beside the groups."""

import json
import subprocess
import sys

import yaml

from conftest import ROOT


def recipe(path, name, hidden):
    path.write_text(yaml.safe_dump({
        "name": name, "data": {"name": "digits", "batch_size": 64},
        "model": {"name": "mlp", "kwargs": {"hidden": [hidden]}}, "optim": {"lr": 3e-3},
        "loop": {"max_steps": 25, "max_epochs": None, "eval_every": 25}, "logging": {"progress": "off"}}))
    return path


def ecotrain(*args):
    return subprocess.run([sys.executable, "-m", "ecotrain", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def test_until_decided_trains_both_sides_on_the_same_seeds_and_writes_the_decision(tmp_path):
    base, cand = recipe(tmp_path / "b.yaml", "wide", 64), recipe(tmp_path / "c.yaml", "narrow", 8)
    r = ecotrain("fit", cand, "--seeds", "0-1", "--baseline", base, "--until-decided", "--max-seeds", "3",
                 "--by", "flops", "--max-accuracy-drop", "0.02", "--run-dir", tmp_path / "p", "--quiet")
    assert r.returncode in (0, 1), r.stderr
    decision = json.loads((tmp_path / "p-decision.json").read_text())
    seeds = decision["seeds"]
    assert seeds[:2] == [0, 1] and 2 <= len(seeds) <= 3 and decision["looks"] == len(seeds) - 1
    assert decision["verdict"] in ("PASS", "FAIL", "INCONCLUSIVE") and (len(seeds) == 3 or decision["verdict"] != "INCONCLUSIVE")
    for group in ("p-group.json", "p-baseline-group.json"):
        assert json.loads((tmp_path / group).read_text())["seeds"] == seeds
    assert f"decision: {decision['verdict']}" in r.stdout and "paired, n=" in r.stdout
    assert (r.returncode == 0) == (decision["verdict"] == "PASS")


def test_until_decided_needs_a_baseline_in_one_line(tmp_path):
    r = ecotrain("fit", recipe(tmp_path / "c.yaml", "narrow", 8), "--seeds", "0-1", "--until-decided",
                 "--run-dir", tmp_path / "p")
    assert r.returncode == 2 and "--until-decided: give --baseline RECIPE and --seeds" in r.stderr
    assert len([ln for ln in r.stderr.splitlines() if ln.strip()]) == 1 and not (tmp_path / "p-s0").exists()


def test_the_sides_train_in_turn_seed_by_seed(tmp_path):
    """A, B, A, B: a load that comes and goes falls on both sides alike, so measured figures pair up."""
    base, cand = recipe(tmp_path / "b.yaml", "wide", 64), recipe(tmp_path / "c.yaml", "narrow", 8)
    r = ecotrain("fit", cand, "--seeds", "0-1", "--baseline", base, "--by", "flops", "--max-accuracy-drop", "0.5",
                 "--min-cost-cut", "0", "--run-dir", tmp_path / "p", "--quiet")
    assert r.returncode in (0, 1), r.stderr
    order = sorted(["p-baseline-s0", "p-s0", "p-baseline-s1", "p-s1"],
                   key=lambda run: (tmp_path / run / "summary.json").stat().st_mtime_ns)
    assert order == ["p-baseline-s0", "p-s0", "p-baseline-s1", "p-s1"]
    for group in ("p-group.json", "p-baseline-group.json"):
        assert json.loads((tmp_path / group).read_text())["seeds"] == [0, 1]
