"""`compare` part by part on hand-written run folders: load_run's and judge's refusals word for word,
where a run's seed comes from, when two sides pair by seed, the seeds line for each shape of the
sides, a loss metric, a zero baseline, the cost interval (paired or not), the notes on measured
energy and on distilled runs, and group files as run lists."""

import json
from pathlib import Path

import pytest

from ecotrain.accounting.compare import compare, judge, load_run, pairing, run_seed, split_runs
from ecotrain.accounting.report import num
from ecotrain.base.errors import ConfigError
from ecotrain.base.stats import diff_ci
from tests.unit.test_accounting_compare import make_run


def _edit(run, name, change):
    p = Path(run) / name
    data = json.loads(p.read_text())
    change(data)
    p.write_text(json.dumps(data))
    return run


def _line(report, start):
    return next(line for line in report.splitlines() if line.startswith(start))


def test_load_run_names_what_is_missing(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_run(str(tmp_path / "nope"))
    assert str(err.value) == f"{tmp_path / 'nope'}: not a run folder (no such folder)"
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError) as err:
        load_run(str(tmp_path / "f"))
    assert str(err.value) == f"{tmp_path / 'f'}: a file, not a run folder (looked for {tmp_path / 'f'}/summary.json)"
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(ConfigError) as err:
        load_run(str(run))
    assert str(err.value) == (f"{run}: not a run folder (no summary.json, no config.yaml); "
                              "give the folders that `ecotrain fit` wrote")
    (run / "config.yaml").write_text("name: x\n")
    with pytest.raises(ConfigError) as err:
        load_run(str(run))
    assert str(err.value) == f"{run}: no summary.json (the run did not finish)"
    (run / "summary.json").write_text("{oops")
    with pytest.raises(ConfigError) as err:
        load_run(str(run))
    assert str(err.value) == (f"{run / 'summary.json'}: not readable JSON "
                              "(Expecting property name enclosed in double quotes: line 1 column 2 (char 1)); "
                              "restore it, or run the training again")
    (run / "summary.json").write_text("[1]")
    with pytest.raises(ConfigError) as err:
        load_run(str(run))
    assert str(err.value) == (f"{run / 'summary.json'}: not a JSON object, so not an ecotrain run summary; "
                              "restore it, or run the training again")


@pytest.mark.skipif(not Path("/proc/self/mem").exists(), reason="needs Linux's /proc/self/mem")
def test_an_unreadable_summary_names_the_os_error(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").symlink_to("/proc/self/mem")  # a regular file whose read fails (EIO)
    with pytest.raises(ConfigError) as err:
        load_run(str(run))
    assert str(err.value) == (f"{run / 'summary.json'}: not readable JSON (Input/output error); "
                              "restore it, or run the training again")


def test_a_runs_seed(tmp_path):
    run = make_run(tmp_path / "r", 0.9, 1.0, seed=7)
    assert run_seed(run, {}) == 7 and run_seed(run, {"seed": 5}) == 5  # summary.json first
    assert run_seed(run, {"seed": "5"}) is None and run_seed(run, {"seed": True}) is None
    assert run_seed(str(tmp_path / "none"), {}) is None  # no config.yaml
    (tmp_path / "r" / "config.yaml").write_text("seed: [unclosed\n")
    assert run_seed(run, {}) is None
    (tmp_path / "r" / "config.yaml").write_text("- a list\n")
    assert run_seed(run, {}) is None
    (tmp_path / "r" / "config.yaml").write_text("seed: x\n")
    assert run_seed(run, {}) is None


def test_pairing_needs_the_same_distinct_known_seeds():
    assert pairing([1, 2], [2, 1]) == [1, 0]
    assert pairing([3, 1, 2], [1, 2, 3]) == [2, 0, 1]
    assert pairing([1], [1]) is None
    assert pairing([1, 2], [1, None]) is None and pairing([1, None], [1, 2]) is None
    assert pairing([1, 1], [1, 1]) is None and pairing([1, 2], [1, 3]) is None


def test_judge_refusals(tmp_path):
    base = make_run(tmp_path / "b", 0.9, 1.0)
    with pytest.raises(ConfigError) as err:
        judge([base], [base], by="joules")
    assert str(err.value) == "--by: one of flops, cpu_seconds, wall_seconds, energy, co2e, cost (got 'joules')"
    with pytest.raises(ConfigError) as err:
        judge([base], [base], metric="val_f1")
    assert str(err.value) == f"{base}: summary.json has no 'val_f1' (choose another with --metric)"
    cand = make_run(tmp_path / "c", 0.9, None)
    with pytest.raises(ConfigError) as err:
        judge([base], [cand])  # by co2e: the default
    assert str(err.value) == (f"--by co2e: {cand} has no CO2e kg figure (no energy figure); "
                              "compare --by flops or cpu_seconds instead")


def test_the_seeds_line_for_each_shape(tmp_path):
    b = [make_run(tmp_path / f"b{i}", 0.9, 1.0, seed=s) for i, s in enumerate((1, 2))]
    c = [make_run(tmp_path / f"c{i}", 0.9, 0.4, seed=s) for i, s in enumerate((3, 4))]
    u = [make_run(tmp_path / f"u{i}", 0.9, 0.4) for i in range(2)]
    seeds = lambda r: _line(r, "seeds:")  # noqa: E731
    assert seeds(judge(b, c)[0]) == "seeds: baseline 1,2; candidate 3,4: unpaired (Welch): not the same seeds"
    assert seeds(judge(b, u)[0]) == "seeds: baseline 1,2; candidate ?,?: unpaired (Welch): a run's seed is not recorded"
    assert seeds(judge(b[:1], c)[0]) == "seeds: baseline 1; candidate 3,4: the baseline has one run: no interval"
    assert seeds(judge(b, c[:1])[0]) == "seeds: baseline 1,2; candidate 3: the candidate has one run: no interval"
    assert seeds(judge(b[:1], u[:1])[0]) == "seeds: baseline 1; candidate ?: one run per side: no interval"


def test_one_run_against_two(tmp_path):
    b = [make_run(tmp_path / "b", 0.9, 1.0, seed=1)]
    c = [make_run(tmp_path / f"c{s}", 0.9, 0.4, seed=s) for s in (1, 2)]
    report, verdict = judge(b, c, by="energy")
    assert report.splitlines()[0].split() == ["baseline", "candidate", "(mean", "of", "2", "[95%", "CI])", "ratio",
                                              "change"]
    assert _line(report, "test_accuracy:") == ("test_accuracy: 0.9000 -> 0.9000, drop +0.0000 (allowed 0.01): PASS "
                                               "(on one seed on a side: no interval)")
    assert _line(report, "energy kWh (measured):") == ("energy kWh (measured): 1 -> 0.4, cut 60.0% (required 50%): "
                                                       "PASS (a point check on the means)")
    assert "note: energy figures are estimated (see each ledger.json energy.how)" in report
    assert verdict == "PASS"
    report, _ = judge(c, b, by="energy")
    assert _line(report, "energy kWh (measured):") == ("energy kWh (measured): 0.4 -> 1, cut -150.0% (required 50%): "
                                                       "FAIL (a point check on the means)")
    assert report.splitlines()[0].split()[:6] == ["baseline", "(mean", "of", "2", "[95%", "CI])"]


def test_two_runs_a_side_paired_by_seed(tmp_path):
    b = [make_run(tmp_path / f"b{s}", a, 1.0, seed=s, cpu=cpu) for s, a, cpu in ((1, 0.90, 9.0), (2, 0.92, 12.0))]
    c = [make_run(tmp_path / f"c{s}", a, 0.4, seed=s, cpu=cpu) for s, a, cpu in ((2, 0.91, 4.0), (1, 0.90, 4.5))]
    report, _ = judge(b, c, by="cpu_seconds")
    assert "baseline (mean of 2 [95% CI])" in report and "candidate (mean of 2 [95% CI])" in report
    assert _line(report, "seeds:") == "seeds: baseline 1,2; candidate 2,1: paired by seed (2 per-seed differences)"
    iv = diff_ci([9.0, 12.0], [4.5, 4.0], True)  # seed by seed: 4.5 and 8
    assert iv.mean == 6.25 and iv != diff_ci([9.0, 12.0], [4.5, 4.0], False)
    assert _line(report, "CPU s (measured):") == (
        f"CPU s (measured): 10.5 -> 4.25, cut 59.5% (required 50%; baseline - candidate {num(iv.mean)}, 95% CI "
        f"[{num(iv.low)}, {num(iv.high)}]): PASS (a point check on the means)")
    acc = diff_ci([0.90, 0.92], [0.90, 0.91], True)
    assert _line(report, "test_accuracy:").startswith(
        f"test_accuracy: 0.9100 -> 0.9050, drop {acc.mean:+.4f}, 95% CI [{acc.low:+.4f}, {acc.high:+.4f}] (paired, n=2;")


def test_a_loss_metric_is_judged_by_its_rise(tmp_path):
    b = make_run(tmp_path / "b", 0.9, 1.0)
    c = make_run(tmp_path / "c", 0.9, 0.4)
    _edit(b, "summary.json", lambda s: s.update(val_loss=0.50))
    _edit(c, "summary.json", lambda s: s.update(val_loss=0.60))
    report, ok = compare([b], [c], metric="val_loss")
    assert not ok and _line(report, "val_loss:") == ("val_loss: 0.5000 -> 0.6000, drop +0.1000 (allowed 0.01): FAIL "
                                                     "(on one seed: no interval)")
    report, _ = compare([c], [b], metric="val_loss", min_cost_cut=-2)
    assert "drop -0.1000 (allowed 0.01): PASS" in report and report.endswith("the candidate meets the criteria)")
    assert _line(report, "val_loss ").split() == ["val_loss", "0.6000", "0.5000", "0.833", "-16.7%"]


def test_a_nan_metric_reads_as_nan(tmp_path):
    b = make_run(tmp_path / "b", 0.9, 1.0)
    c = _edit(make_run(tmp_path / "c", 0.9, 0.4), "summary.json", lambda s: s.update(test_accuracy=float("nan")))
    report, verdict = judge([b], [c])
    assert _line(report, "test_accuracy ").split() == ["test_accuracy", "0.9000", "nan", "nan", "+nan%"]
    assert verdict == "FAIL"


def test_missing_cells_a_zero_baseline_and_a_cost_without_currency(tmp_path):
    b = _edit(make_run(tmp_path / "b", 0.9, None, flops=0), "ledger.json", lambda L: L["cost"].pop("currency"))
    c = make_run(tmp_path / "c", 0.9, 0.4, flops=1e9)
    report, verdict = judge([b], [c], by="flops")
    assert _line(report, "energy kWh").split() == ["energy", "kWh", "(measured)", "n/a", "0.4", "n/a", "n/a"]
    assert _line(report, "FLOPs (counted) ").split() == ["FLOPs", "(counted)", "0", "1e+09", "n/a", "n/a"]
    assert _line(report, "cost (measured)").split() == ["cost", "(measured)", "0.01", "0.01", "1.000", "+0.0%"]
    assert _line(report, "FLOPs (counted):") == ("FLOPs (counted): 0 -> 1e+09, cut 0.0% (required 50%): FAIL "
                                                 "(a point check)")
    assert verdict == "FAIL" and report.endswith("verdict: FAIL (test_accuracy PASS, FLOPs (counted) FAIL)")
    assert "note:" not in report  # FLOPs are counted: no note on measured figures


def test_a_counted_pass_says_so(tmp_path):
    b = make_run(tmp_path / "b", 0.9, 1.0, flops=2e9)
    c = make_run(tmp_path / "c", 0.9, 1.0, flops=1e9)
    report, verdict = judge([b], [c], by="flops")
    assert verdict == "PASS" and report.endswith(
        "verdict: PASS (test_accuracy PASS, FLOPs (counted) PASS: the candidate meets the criteria)")


def test_notes_on_measured_energy(tmp_path):
    b = _edit(make_run(tmp_path / "b", 0.9, 1.0), "ledger.json", lambda L: L["energy"].update(method="measured"))
    c = make_run(tmp_path / "c", 0.9, 0.4)
    m = _edit(make_run(tmp_path / "m", 0.9, 0.4), "ledger.json", lambda L: L["energy"].update(method="measured"))
    report, _ = judge([b], [c], by="energy")
    assert "note: energy figures are estimated and measured (see each ledger.json energy.how)" in report
    report, _ = judge([b], [m], by="energy")
    assert "note: energy figures" not in report
    assert "note: energy kWh is measured: it moves with the machine's load" in report
    report, _ = judge([b], [c], by="wall_seconds")
    assert "note: energy figures" not in report and "note: wall s is measured" in report


def test_notes_on_distilled_runs(tmp_path):
    def distilled(name, flag):
        run = make_run(tmp_path / name, 0.9, 1.0)
        return _edit(run, "summary.json", lambda s: s.update(methods={"distill": {"teacher_cost_included": flag}}))

    note = ("note: the {side} is distilled from a teacher; the teacher's training FLOPs are {how} in its FLOPs; its "
            "forward passes are counted; its CPU time and energy are not (see its ledger.json)")
    plain = make_run(tmp_path / "plain", 0.9, 1.0)
    report, _ = judge([plain], [distilled("t", True)], by="flops")
    assert note.format(side="candidate", how="included") in report and "the baseline is distilled" not in report
    report, _ = judge([distilled("f", False)], [plain], by="flops")
    assert note.format(side="baseline", how="NOT included") in report and "the candidate is distilled" not in report
    report, _ = judge([plain], [distilled("t2", True), distilled("f2", False), plain], by="flops")
    assert note.format(side="candidate", how="included in some runs only") in report
    assert "distilled" not in judge([plain], [plain], by="flops")[0]


def test_group_files_stand_for_their_runs(tmp_path):
    (tmp_path / "g-group.json").write_text(json.dumps({"kind": "ecotrain.seed_group", "runs": ["r0", "r1"]}))
    g = str(tmp_path / "g-group.json")
    assert split_runs([g, "x,y", ""]) == [str(tmp_path / "r0"), str(tmp_path / "r1"), "x", "y"]
    assert split_runs(None) == [] and split_runs(["missing-group.json"]) == ["missing-group.json"]


def test_a_measured_verdict_under_contention_is_inconclusive(tmp_path):
    busy = {"seen": True, "load": 3.5, "cpus": 2, "slowdown": 1.8}
    b = make_run(tmp_path / "b", 0.9, 1.0, cpu=10.0)
    c = _edit(make_run(tmp_path / "c", 0.9, 0.4, cpu=4.0), "ledger.json", lambda L: L.update(contention=busy))
    quiet = _edit(make_run(tmp_path / "q", 0.9, 0.4, cpu=4.0), "ledger.json",
                  lambda L: L.update(contention={"seen": False, "load": 0.5}))
    report, verdict = judge([b], [c], by="cpu_seconds")
    assert verdict == "INCONCLUSIVE"
    assert _line(report, "CPU s (measured):") == (
        "CPU s (measured): 10 -> 4, cut 60.0% (required 50%): PASS (a point check); measured under contention, one run "
        "on a side: no interval to hold the load's share, so INCONCLUSIVE")
    assert _line(report, "note: the") == (
        f"note: the CPU s verdict is unreliable: measured under contention (candidate {c}: load 3.5 on 2 CPUs, steps "
        "up to 1.8x slower); rerun on a quiet machine, run the sides in turn (A, B, A, B) on more seeds, or compare "
        "--by flops (counted)")
    assert report.endswith("verdict: INCONCLUSIVE (test_accuracy PASS, CPU s (measured) INCONCLUSIVE: run more seeds)")
    report, verdict = judge([c], [b, c], by="energy", min_cost_cut=-5)
    assert "(baseline " + c + ": load 3.5 on 2 CPUs, steps up to 1.8x slower; candidate " + c in report
    report, verdict = judge([b], [c], by="flops", min_cost_cut=0)  # counted: contention does not matter
    assert verdict == "PASS" and "contention" not in report.split("\n\n")[1].replace("ledger.json `contention`", "")
    assert judge([b], [quiet], by="cpu_seconds")[1] == "PASS"


def test_a_damaged_summary_is_named(tmp_path):
    run = _edit(make_run(tmp_path / "r", 0.9, 1.0), "summary.json", lambda s: s.update(test_accuracy="high"))
    with pytest.raises(ConfigError) as err:
        load_run(run)
    assert str(err.value) == (f"{Path(run) / 'summary.json'}: 'test_accuracy' is \"high\", not a number; the file was "
                              "edited or damaged: restore it, or run the training again")


def test_a_seed_group_is_distinct_runs(tmp_path):
    """The same run given twice, or copies of one seed, are not more seeds: no verdict, one line naming them."""
    import shutil

    base = [make_run(tmp_path / f"b{s}", 0.9, 1.0, seed=s) for s in (0, 1)]
    cand = make_run(tmp_path / "c0", 0.9, 0.4, seed=0)
    copies = [cand] + [shutil.copytree(cand, tmp_path / f"copy{i}") for i in range(199)]
    with pytest.raises(ConfigError) as err:
        judge(base, [str(c) for c in copies])
    assert str(err.value) == (f"candidate runs {cand}, {copies[1]}, {copies[2]} and 197 more all trained seed 0 "
                              "(copies of one run?); a seed group needs distinct seeds: give each seed once, or train "
                              "more with `ecotrain fit --seeds 0-4` (no verdict)")
    again = str(tmp_path / "." / "b0")  # the same folder, spelt another way
    with pytest.raises(ConfigError) as err:
        judge([base[0], again, base[1]], [cand])
    assert str(err.value) == (f"baseline runs {base[0]}, {again} are one run folder given 2 times; each run counts "
                              "as one seed, so give each once (no verdict)")
    assert judge(base, [cand])[1] in ("PASS", "FAIL", "INCONCLUSIVE")  # distinct runs: a verdict
    unknown = [make_run(tmp_path / f"u{i}", 0.9, 1.0) for i in range(2)]  # seeds not recorded: folders still count
    assert judge(unknown, [cand])[1] in ("PASS", "FAIL", "INCONCLUSIVE")


def test_a_sequential_look_prints_its_own_level_not_95(tmp_path):
    """At look 2 the interval is the 99.17% one (alpha 0.05 / 6): printed so, never as a 95% CI."""
    b = [make_run(tmp_path / f"b{s}", a, 1.0, seed=s) for s, a in ((0, 0.90), (1, 0.92), (2, 0.91))]
    c = [make_run(tmp_path / f"c{s}", a, 0.4, seed=s) for s, a in ((0, 0.90), (1, 0.91), (2, 0.905))]
    report, _ = judge(b, c, look=2)
    line = _line(report, "test_accuracy:")
    assert "99.17% CI [" in line and "95% CI" not in line and "sequential look 2: 99.1667% interval" in line
    report, _ = judge(b, c)
    assert "95% CI [" in _line(report, "test_accuracy:")


def _busy_group(tmp_path, side, cpus, acc=0.9):
    busy = {"seen": True, "load": 5.5, "cpus": 2, "slowdown": 1.3}
    return [_edit(make_run(tmp_path / f"{side}{i}", acc, 1.0, seed=i, cpu=x), "ledger.json",
                  lambda L: L.update(contention=busy)) for i, x in enumerate(cpus)]


def test_a_measured_interval_wholly_past_the_threshold_decides_under_contention(tmp_path):
    """Load moves measured figures, but when the cut's whole interval lies on one side of the required
    cut, that is a verdict, not INCONCLUSIVE; the note says how the load entered the interval."""
    base = _busy_group(tmp_path, "b", [10.0, 14.0, 11.0, 13.0])
    cheap = _busy_group(tmp_path, "c", [4.0, 5.8, 4.3, 5.1])  # about 0.4x, seed by seed
    report, verdict = judge(base, cheap, by="cpu_seconds")
    assert verdict == "PASS"
    line = _line(report, "CPU s (measured):")
    assert "the cut's 95% CI [" in line and line.endswith(
        "PASS (measured under contention: the interval, wholly at or above the required cut, decides)")
    low = float(line.split("the cut's 95% CI [")[1].split("%")[0])
    assert 50 < low < 60
    note = _line(report, "note: measured under contention")
    assert "the load entered the CPU s interval as spread (paired by seed" in note and "A, B, A, B" in note
    assert "and 5 more runs, load up to 5.5, steps up to 1.3x slower" in note  # 8 busy runs: 3 named
    dear = _busy_group(tmp_path, "d", [8.0, 11.0, 9.0, 10.5])  # about 0.8x: wholly short of a 50% cut
    report, verdict = judge(base, dear, by="cpu_seconds")
    assert verdict == "FAIL" and "wholly below the required cut" in report
    near = _busy_group(tmp_path, "n", [4.0, 8.0, 6.5, 6.0])  # about 0.51x, wide: straddles
    report, verdict = judge(base, near, by="cpu_seconds")
    assert verdict == "INCONCLUSIVE" and "straddles the required cut" in report
    assert "note: the CPU s verdict is unreliable" in report
