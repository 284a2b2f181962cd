"""The contention mark: ContentionWatch warns once when steps slow down on an over-loaded machine,
its record rides in ledger.json (merged over resumed segments), and `compare` calls a measured
verdict unreliable (INCONCLUSIVE) when either side was contended and one run per side gives no interval
(several seeds: the cut's interval decides, test_accounting_compare_parts.py); a counted one stands."""

import json
import logging

from ecotrain.accounting.compare import compare, judge
from ecotrain.accounting.contention import ContentionWatch, cpu_pressure, merge
from ecotrain.accounting.report import format_ledger, summary_line


def make_run(path, acc, kwh):
    """A finished run folder: summary.json and a ledger.json without a contention record (an older ledger)."""
    path.mkdir(parents=True)
    (path / "config.yaml").write_text("name: x\n")
    (path / "summary.json").write_text(json.dumps({"test_accuracy": acc}))
    ledger = {"name": "x", "steps": 10, "samples": 320, "stopped_because": "max_steps", "segments": 1,
              "wall_seconds": 10.0, "cpu_seconds": 9.0, "cpu_hours": 9.0 / 3600,
              "flops": {"total": 1e9, "train": 1e9, "eval": 0},
              "energy": {"kwh": kwh, "method": "measured", "how": "test", "source": "test", "notes": [],
                         "missing_reason": None},
              "co2e": {"kg": kwh * 0.05, "g_per_kwh": 50.0, "grid": "FRA", "missing_reason": None},
              "cost": {"amount": 0.01, "currency": "USD", "missing_reason": None}}
    (path / "ledger.json").write_text(json.dumps(ledger))
    return str(path)


def test_warns_once_when_slow_and_overloaded(caplog):
    watch = ContentionWatch(cpus=2)
    with caplog.at_level(logging.WARNING, logger="ecotrain"):
        watch.check(0.01, 0.5, None)  # quiet: the fastest interval
        watch.check(0.03, 1.5, None)  # slower, but the machine is not over-loaded: not contention
        watch.check(0.05, 4.2, None)  # 5x slower with load 4.2 on 2 CPUs
        watch.check(0.06, 4.5, None)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "5.0x slower" in warnings[0] and "load 4.2 on 2 CPUs" in warnings[0]
    r = watch.record()
    assert r["seen"] and r["load"] == 4.5 and r["slowdown"] == 6.0 and r["contended_samples"] == 2


def test_cpu_pressure_alone_counts_and_a_quiet_run_is_clean(tmp_path):
    psi = tmp_path / "cpu"
    psi.write_text("some avg10=85.00 avg60=40.00 avg300=10.00 total=1\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    assert cpu_pressure(str(psi)) == 85.0 and cpu_pressure(str(tmp_path / "none")) is None
    watch = ContentionWatch(cpus=2)
    watch.check(0.01, 1.0, 85.0)
    assert watch.record()["seen"]  # load under the CPUs, but tasks waited for a CPU 85% of the time
    quiet = ContentionWatch(cpus=2)
    for _ in range(3):
        quiet.check(0.01, 1.9, 5.0)
    assert quiet.record() == {"seen": False, "load": 1.9, "pressure": 5.0, "slowdown": 1.0, "cpus": 2,
                              "samples": 3, "contended_samples": 0}


def test_segments_merge():
    a = {"seen": True, "load": 5.0, "pressure": None, "slowdown": 3.0, "cpus": 2, "samples": 4, "contended_samples": 3}
    b = {"seen": False, "load": 1.0, "pressure": 2.0, "slowdown": 1.0, "cpus": 2, "samples": 2, "contended_samples": 0}
    m = merge(a, b)
    assert m["seen"] and m["load"] == 5.0 and m["samples"] == 6 and m["pressure"] == 2.0
    assert merge(None, b) == b and merge(a, None) == a


def busy_run(path, acc, kwh, seen=True):
    run = make_run(path, acc, kwh)
    ledger = json.loads((path / "ledger.json").read_text())
    ledger["contention"] = {"seen": seen, "load": 7.5, "pressure": None, "slowdown": 4.0, "cpus": 2,
                            "samples": 10, "contended_samples": 9 if seen else 0}
    (path / "ledger.json").write_text(json.dumps(ledger))
    return run


def test_compare_calls_a_measured_verdict_unreliable_under_contention(tmp_path):
    base = busy_run(tmp_path / "base", 0.90, 1.0)
    cand = make_run(tmp_path / "cand", 0.90, 0.4)
    report, verdict = judge([base], [cand], by="energy")
    assert verdict == "INCONCLUSIVE" and not compare([base], [cand], by="energy")[1]
    assert "cut 60.0%" in report and ("measured under contention, one run on a side: no interval to hold the load's "
                                      "share, so INCONCLUSIVE") in report
    assert f"note: the energy kWh verdict is unreliable: measured under contention (baseline {base}: load 7.5 on 2 CPUs" \
        in report
    report, verdict = judge([base], [cand], by="flops")  # counted: the load does not move it
    assert "contention" not in report and verdict == "FAIL"  # equal FLOPs: no cut


def test_quiet_marks_change_nothing(tmp_path):
    base = busy_run(tmp_path / "base", 0.90, 1.0, seen=False)
    cand = make_run(tmp_path / "cand", 0.90, 0.4)  # an older ledger without the key
    report, verdict = judge([base], [cand], by="energy")
    assert verdict == "PASS" and "unreliable" not in report


def test_ledger_text_says_so(tmp_path):
    busy_run(tmp_path / "r", 0.9, 1.0)
    ledger = json.loads((tmp_path / "r" / "ledger.json").read_text())
    assert summary_line(ledger).endswith("; measured on a busy machine (ledger.json contention)")
    ledger.update(device_hours={"cpu": 0.01}, device={"count": 2, "unit": "vCPU"}, budget={"limits": {}, "stopped_by": None})
    ledger["flops"]["method"] = "x"
    ledger["energy"]["method"] = "estimated"
    ledger["co2e"].update(source="x")
    ledger["cost"].update(price_per_device_hour=1, source="x")
    assert "contention    measured on a busy machine: load up to 7.5 on 2 CPUs, steps up to 4.0x" in format_ledger(ledger)
