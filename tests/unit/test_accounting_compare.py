"""`compare` on hand-written run folders: the verdict, medians over seeds, missing figures."""

import json

import pytest

from ecotrain.accounting.compare import compare, split_runs
from ecotrain.accounting.report import summary_line
from ecotrain.cli import main
from ecotrain.errors import ConfigError


def make_run(path, acc, kwh, flops=1e9, g=50.0):
    path.mkdir(parents=True)
    (path / "config.yaml").write_text("name: x\n")
    (path / "summary.json").write_text(json.dumps({"test_accuracy": acc}))
    energy = {"kwh": kwh, "method": "estimated" if kwh else None, "how": "test", "source": "test", "notes": [],
              "missing_reason": None if kwh else "CodeCarbon is not available"}
    ledger = {"name": "x", "steps": 10, "samples": 320, "stopped_because": "max_steps", "segments": 1,
              "wall_seconds": 10.0, "cpu_seconds": 9.0, "cpu_hours": 9 / 3600,
              "flops": {"total": flops, "train": flops, "eval": 0},
              "energy": energy,
              "co2e": {"kg": kwh * g / 1000 if kwh else None, "g_per_kwh": g, "grid": "FRA",
                       "missing_reason": None if kwh else "no energy figure"},
              "cost": {"amount": 0.01, "currency": "USD", "missing_reason": None}}
    (path / "ledger.json").write_text(json.dumps(ledger))
    return str(path)


def test_pass_and_fail(tmp_path):
    base = make_run(tmp_path / "base", 0.90, 1.0)
    good = make_run(tmp_path / "good", 0.895, 0.4)
    worse = make_run(tmp_path / "worse", 0.85, 0.4)
    costly = make_run(tmp_path / "costly", 0.91, 0.8)
    report, ok = compare([base], [good])
    assert ok and "verdict: PASS" in report and "cut 60.0%" in report and "0.400" in report  # the ratio
    assert not compare([base], [worse])[0].count("PASS") and not compare([base], [worse])[1]
    assert not compare([base], [costly])[1]
    assert compare([base], [costly], min_cost_cut=0.2)[1]
    assert compare([base], [worse], max_accuracy_drop=0.06)[1]


def test_medians_and_spread(tmp_path):
    base = [make_run(tmp_path / f"b{i}", a, 1.0) for i, a in enumerate([0.90, 0.91, 0.70])]
    cand = [make_run(tmp_path / f"c{i}", a, k) for i, (a, k) in enumerate([(0.90, 0.5), (0.89, 0.4), (0.95, 0.45)])]
    report, ok = compare(base, cand)
    assert ok  # medians: accuracy 0.90 -> 0.90, energy 1.0 -> 0.45 kWh
    assert "median of 3" in report and "[0.4..0.5]" in report and "[0.7..0.91]" in report


def test_missing_figure_is_a_clear_error(tmp_path):
    base, cand = make_run(tmp_path / "b", 0.9, 1.0), make_run(tmp_path / "c", 0.9, None)
    with pytest.raises(ConfigError, match="no energy kWh figure.*CodeCarbon is not available"):
        compare([base], [cand], by="energy")
    assert compare([base], [make_run(tmp_path / "d", 0.9, None, flops=4e8)], by="flops")[1]
    with pytest.raises(ConfigError, match="not a run folder"):
        compare([str(tmp_path / "nope")], [base])


def test_cli_exit_codes_and_run_lists(tmp_path, capsys):
    b1, b2 = make_run(tmp_path / "b1", 0.9, 1.0), make_run(tmp_path / "b2", 0.9, 1.2)
    c1, c2 = make_run(tmp_path / "c1", 0.9, 0.3), make_run(tmp_path / "c2", 0.9, 0.35)
    assert main(["compare", f"{b1},{b2}", f"{c1},{c2}"]) == 0
    assert main(["compare", "--baseline", b1, b2, "--candidate", c1, c2, "--by", "energy"]) == 0
    assert main(["compare", c1, b1]) == 1  # the other way round: more energy
    assert main(["compare", b1]) == 2 and "ecotrain: error: compare:" in capsys.readouterr().err
    assert split_runs(["a,b", "c"]) == ["a", "b", "c"]


def test_summary_line_says_what_is_missing(tmp_path):
    make_run(tmp_path / "r", 0.9, None)
    L = json.loads((tmp_path / "r" / "ledger.json").read_text())
    line = summary_line(L)
    assert line.startswith("ledger: 1e+09 FLOPs") and "energy n/a" in line and "CO2e n/a" in line
