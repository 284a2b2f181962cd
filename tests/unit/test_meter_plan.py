"""accounting/meter_plan.py: CodeCarbon's hardware plan is probed once per machine and reused by the
next run (no py-cpuinfo subprocess, no pandas), only where it is the same answer; a damaged or
hand-made file is ignored and replaced, never trusted, never an error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ecotrain.accounting import meter_plan
from ecotrain.accounting.energy import EnergyMeter

hc = pytest.importorskip("codecarbon.core.hardware_cache")  # CodeCarbon is a core dependency: present


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ECOTRAIN_CACHE", str(tmp_path / "cache"))
    fresh()  # CodeCarbon's own per-process plans: each test starts as a fresh process would
    yield tmp_path / "cache"
    fresh()


def fresh():
    hc.clear_cache()
    meter_plan._NOTES.clear()
    meter_plan._SOURCE.clear()


def tracker():
    from codecarbon import OfflineEmissionsTracker

    return OfflineEmissionsTracker(country_iso_code="USA", output_methods=[], tracking_mode="process",
                                   allow_multiple_runs=True, log_level="error", gpu_ids=None)


def measured(cache: Path) -> dict:
    """One real meter's reading on this machine; the plan file it leaves."""
    m = EnergyMeter(pue=1.0, tracking_mode="process", sample_seconds=0.5)
    m.start()
    sum(i * i for i in range(200_000))
    e = m.stop()
    assert e["kwh"] and e["kwh"] > 0, e
    return e


def plan_file(cache: Path) -> Path:
    files = list((cache / "meter").glob("hardware-*.json"))
    assert len(files) == 1, files
    return files[0]


def test_a_probed_plan_is_saved_and_the_next_run_reuses_it_with_the_same_method(cache):
    if any(os.path.exists(p) for p in meter_plan._GPU_NODES):
        pytest.skip("a GPU machine always probes (meter_plan.py)")  # not this project's CI: no GPU there
    first = measured(cache)
    assert first["meter_startup"]["hardware"] == "probed"
    path = plan_file(cache)
    saved = json.loads(path.read_text())
    assert meter_plan.valid_plan(saved["plan"], "process")
    fresh()  # as a new process
    second = measured(cache)
    assert second["meter_startup"]["hardware"] == "cached"
    # the same hardware description and method: only the probe was skipped
    assert second["components_method"] == first["components_method"]
    assert second["notes"] == first["notes"]  # what CodeCarbon said when it probed, kept with the plan
    assert second["how"].split("; from the first step")[0] == first["how"].split("; from the first step")[0]


def test_a_fresh_process_with_the_plan_imports_neither_pandas_nor_cpuinfo(cache, tmp_path):
    if any(os.path.exists(p) for p in meter_plan._GPU_NODES):
        pytest.skip("a GPU machine always probes (meter_plan.py)")
    measured(cache)
    code = ("import sys\nfrom ecotrain.accounting.energy import EnergyMeter\n"
            "m = EnergyMeter(1.0, 'process', 0.5); m.start(); e = m.stop()\n"
            "print(e['meter_startup']['hardware'], 'pandas' in sys.modules, 'cpuinfo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "ECOTRAIN_CACHE": str(cache)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["cached", "False", "False"], out.stdout


def good_plan() -> dict:
    return {"ram_tracker": "RAM power estimation model", "cpu_tracker": "cpu_load", "gpu_tracker": "Unspecified",
            "conf": {"ram_total_size": 23.5, "cpu_count": 2, "cpu_physical_count": 1, "cpu_model": "X",
                     "gpu_count": 0, "gpu_model": "", "gpu_ids": None},
            "hardware_specs": [{"kind": "ram", "tracking_mode": "process", "force_ram_power": None},
                               {"kind": "cpu", "mode": "cpu_load", "model": "X", "tdp": 8, "tracking_mode": "process",
                                "rapl_include_dram": False, "rapl_prefer_psys": False}]}


def edited(change) -> dict:
    p = good_plan()
    change(p)
    return p


@pytest.mark.parametrize("plan", [
    edited(lambda p: p["hardware_specs"][1].update(tdp=float("nan"))),
    edited(lambda p: p["hardware_specs"][1].update(tdp=-8)),
    edited(lambda p: p["hardware_specs"][1].update(tdp=1e12)),
    edited(lambda p: p["hardware_specs"][1].update(tdp=9_999)),  # 9,999 W on a 2-core machine: a hand edit
    edited(lambda p: p["hardware_specs"][1].update(tdp="8")),
    edited(lambda p: p["hardware_specs"][1].update(tdp=True)),
    edited(lambda p: p["hardware_specs"][1].update(mode="intel_rapl", rapl_dir="/tmp/fake-rapl")),
    edited(lambda p: p["hardware_specs"][1].update(mode="powermetrics")),
    edited(lambda p: p["hardware_specs"][1].update(tracking_mode="machine")),
    edited(lambda p: p["hardware_specs"][1].update(extra="x")),
    edited(lambda p: p["hardware_specs"].append({"kind": "gpu", "gpu_ids": None})),
    edited(lambda p: p["hardware_specs"].pop()),
    edited(lambda p: p["conf"].update(gpu_count=1)),
    edited(lambda p: p["conf"].update(cpu_count=float("inf"))),
    edited(lambda p: p["conf"].update(cpu_model="x" * 10_000)),
    edited(lambda p: p["conf"].update(unknown=1)),
    edited(lambda p: p.update(cpu_tracker=["cpu_load"])),
    edited(lambda p: p.pop("conf")),
    [], None, "plan", 0,
])
def test_a_hand_edited_plan_is_refused(plan):
    assert meter_plan.valid_plan(good_plan(), "process")
    assert not meter_plan.valid_plan(plan, "process")


def write_saved(cache: Path, t, obj) -> Path:
    """A plan file where this machine's would be, holding `obj` (text or JSON)."""
    fp = meter_plan.fingerprint(hc.make_key(t))
    path = meter_plan._file(fp)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return path


@pytest.mark.parametrize("damage", ["truncated", "not-json", "bad-plan", "other-host", "other-version",
                                    "list", "huge", "directory", "symlink", "fifo", "binary"])
def test_a_damaged_or_foreign_plan_file_is_ignored_then_replaced_by_a_probe(cache, tmp_path, damage):
    if any(os.path.exists(p) for p in meter_plan._GPU_NODES):
        pytest.skip("a GPU machine always probes (meter_plan.py)")
    t = tracker()
    fp = meter_plan.fingerprint(hc.make_key(t))
    good = {"fingerprint": fp, "plan": good_plan()}
    path = meter_plan._file(fp)
    path.parent.mkdir(parents=True, exist_ok=True)
    if damage == "truncated":
        path.write_text(json.dumps(good)[:100])
    elif damage == "not-json":
        path.write_text("\x00\x01 not json")
    elif damage == "bad-plan":
        path.write_text(json.dumps({**good, "plan": edited(lambda p: p["hardware_specs"][1].update(tdp=-1))}))
    elif damage == "other-host":
        path.write_text(json.dumps({**good, "fingerprint": {**fp, "host": "elsewhere"}}))
    elif damage == "other-version":
        path.write_text(json.dumps({**good, "fingerprint": {**fp, "codecarbon": "0.0.1"}}))
    elif damage == "list":
        path.write_text("[1, 2, 3]")
    elif damage == "huge":
        path.write_text(json.dumps({**good, "pad": "x" * (meter_plan.MAX_BYTES + 10)}))
    elif damage == "directory":
        path.mkdir()
    elif damage == "symlink":
        target = tmp_path / "elsewhere.json"
        target.write_text(json.dumps(good))
        path.symlink_to(target)
    elif damage == "fifo":
        os.mkfifo(path)  # opening it for reading must not block: O_NONBLOCK, then fstat says not a file
    elif damage == "binary":
        path.write_bytes(os.urandom(512))
    assert meter_plan.install(t, None) == ("probed", True)
    assert not hc._plans  # nothing from the file reached CodeCarbon
    if damage in ("directory", "fifo"):
        return  # the path is taken by something that is not a file: the probe's answer is not saved there
    e = measured(cache)  # CodeCarbon probes as it would without a cache, and its answer replaces the file
    assert e["meter_startup"]["hardware"] == "probed"
    saved = json.loads(path.read_text())
    assert saved["fingerprint"] == fp and meter_plan.valid_plan(saved["plan"], "process")
    assert not path.is_symlink()


def test_a_good_file_is_installed_into_codecarbons_cache(cache):
    if any(os.path.exists(p) for p in meter_plan._GPU_NODES):
        pytest.skip("a GPU machine always probes (meter_plan.py)")
    t = tracker()
    write_saved(cache, t, {"fingerprint": meter_plan.fingerprint(hc.make_key(t)), "plan": good_plan(),
                           "notes": ["an unknown CPU model"]})
    assert meter_plan.install(t, None) == ("cached", False)
    assert hc._plans[hc.make_key(t)].hardware_specs[1]["tdp"] == 8
    assert meter_plan.notes(t) == ["an unknown CPU model"]
    assert meter_plan.install(tracker(), None) == ("cached", False)  # a second tracker in the process: the same answer


@pytest.mark.parametrize("notes", ["text", [1, 2], ["x" * 1000], ["n"] * 50, {"a": 1}, None])
def test_a_plan_with_damaged_notes_is_probed_again(cache, notes):
    t = tracker()
    write_saved(cache, t, {"fingerprint": meter_plan.fingerprint(hc.make_key(t)), "plan": good_plan(), "notes": notes})
    assert meter_plan.install(t, None) == ("probed", True)
    assert not hc._plans


def test_the_warm_up_probe_is_reported_as_a_probe_and_its_notes_reach_the_next_run(cache):
    if any(os.path.exists(p) for p in meter_plan._GPU_NODES):
        pytest.skip("a GPU machine always probes (meter_plan.py)")
    code = ("import json\nfrom ecotrain.accounting.energy import EnergyMeter, warm_up\nwarm_up('process')\n"
            "import torch\nm = EnergyMeter(1.0, 'process', 0.5); m.start(); e = m.stop()\n"
            "print(json.dumps([e['meter_startup']['hardware'], e['notes']]))")
    env = {**os.environ, "ECOTRAIN_CACHE": str(cache)}
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
            for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    (how1, notes1), (how2, notes2) = (json.loads(r.stdout.strip().splitlines()[-1]) for r in runs)
    assert (how1, how2) == ("probed", "cached") and notes2 == notes1
    assert not any("codecarbon" in line.lower() for r in runs for line in r.stderr.splitlines())  # heard, not printed


def test_a_plan_reading_rapl_counters_this_machine_does_not_show_is_refused(cache):
    t = tracker()
    fp = meter_plan.fingerprint(hc.make_key(t))
    plan = edited(lambda p: p["hardware_specs"][1].update(mode="intel_rapl", tdp=None))
    assert meter_plan.valid_plan(plan, "process")
    write_saved(cache, t, {"fingerprint": {**fp, "rapl_readable": []}, "plan": plan})
    assert meter_plan.install(t, None) == ("probed", True)  # no readable counters here (or another fingerprint): probe


def test_gpus_always_probe(cache):
    t = tracker()
    write_saved(cache, t, {"fingerprint": meter_plan.fingerprint(hc.make_key(t)), "plan": good_plan()})
    assert meter_plan.install(t, [0]) == ("probed", True)
    meter_plan.remember(t, [0])  # nothing saved for a GPU run either


def test_no_home_and_no_cache_folder_means_no_cache_and_no_error(monkeypatch, tmp_path):
    fresh()
    for var in ("ECOTRAIN_CACHE", "XDG_CACHE_HOME", "HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(Path, "expanduser", lambda self: (_ for _ in ()).throw(RuntimeError("no home")))
    t = tracker()
    assert meter_plan.install(t, None) == ("probed", True)
    meter_plan.remember(t, None)  # no folder: nothing written, nothing raised
    fresh()


def test_an_unwritable_cache_folder_is_no_error(cache):
    cache.mkdir(parents=True)
    (cache / "meter").write_text("a file where the folder would be")
    e = measured(cache)
    assert e["kwh"] > 0 and e["meter_startup"]["hardware"] == "probed"


def test_two_runs_probing_at_once_leave_one_whole_plan(cache):
    if any(os.path.exists(p) for p in meter_plan._GPU_NODES):
        pytest.skip("a GPU machine always probes (meter_plan.py)")
    code = ("from ecotrain.accounting.energy import EnergyMeter\n"
            "m = EnergyMeter(1.0, 'process', 0.5); m.start(); e = m.stop(); print(e['meter_startup']['hardware'])")
    env = {**os.environ, "ECOTRAIN_CACHE": str(cache)}
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    saved = json.loads(plan_file(cache).read_text())  # one file, whole: each writer replaced it atomically
    assert meter_plan.valid_plan(saved["plan"], "process")
    assert not [f for f in (cache / "meter").iterdir() if ".tmp" in f.name]


def test_what_the_probe_said_reaches_every_run_whoever_probed(cache, monkeypatch):
    """The CLI probes in its warm-up thread (`energy._warm`), then the meter sets the same hardware up
    again: that second set-up is no probe, says nothing, and must neither report `cached` nor wipe the
    probe's notes; a later process reads them from the file."""
    if any(os.path.exists(p) for p in meter_plan._GPU_NODES):
        pytest.skip("a GPU machine always probes (meter_plan.py)")
    import logging

    from codecarbon.core.resource_tracker import ResourceTracker

    from ecotrain.accounting import energy

    real = ResourceTracker.set_RAM_tracking

    def said(self, *a, **k):  # whatever this machine's probe says, it says this too
        logging.getLogger("codecarbon").warning("a probe's warning, for the test")
        return real(self, *a, **k)

    monkeypatch.setattr(ResourceTracker, "set_RAM_tracking", said)
    energy._warm("process")  # the warm-up's probe, in this thread
    runs = [measured(cache) for _ in range(2)]  # the meter's own set-ups in the same process
    fresh()  # as a new process
    runs.append(measured(cache))
    assert [e["meter_startup"]["hardware"] for e in runs] == ["probed", "probed", "cached"]
    for e in runs:
        assert "a probe's warning, for the test" in e["notes"], e["notes"]
    saved = json.loads(plan_file(cache).read_text())
    assert "a probe's warning, for the test" in saved["notes"]


def test_a_killed_writers_old_temporary_file_is_swept(cache):
    if any(os.path.exists(p) for p in meter_plan._GPU_NODES):
        pytest.skip("a GPU machine always probes (meter_plan.py)")
    folder = cache / "meter"
    folder.mkdir(parents=True)
    old, new = folder / ".hardware-old.json.tmp-1", folder / ".hardware-new.json.tmp-2"  # atomic_write's names
    old.write_text("{")
    new.write_text("{")
    os.utime(old, (1, 1))
    measured(cache)
    assert not old.exists() and new.exists()  # a writer of now may still be renaming its own
