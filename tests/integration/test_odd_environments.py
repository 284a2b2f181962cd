"""Environments a user really has: no home folder (HOME unset and no passwd entry, an arbitrary
container uid) and run folders whose names are not UTF-8 (made under another locale). Each gets the
command's result, or one line and error.log; never a traceback, from the command or from the error
boundary itself (cli.program._failed)."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT, run_cli

# Runs the CLI as a user with no passwd entry: pathlib's home lookup falls back to pwd.getpwuid, which
# then raises KeyError. `FAIL=cmd` makes that command's handler raise, to reach the error boundary.
DRIVER = textwrap.dedent('''
    import importlib, os, pwd, runpy, sys

    def no_entry(uid):
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    pwd.getpwuid = no_entry
    if os.environ.get("FAIL"):
        module, _, name = os.environ["FAIL"].partition(":")
        def broken(args, ctx):
            raise ZeroDivisionError("division by zero")
        setattr(importlib.import_module(module), name, broken)
    sys.argv = ["ecotrain", *sys.argv[1:]]
    runpy.run_module("ecotrain", run_name="__main__")
''')


def homeless(tmp_path, *args, fail=None, locale=None, cache=None):
    env = {k: v for k, v in os.environ.items() if k not in ("HOME", "XDG_CACHE_HOME", "ECOTRAIN_CACHE")}
    env.update({"TMPDIR": str(tmp_path / "tmp"), "MPLCONFIGDIR": str(tmp_path / "mpl"), "OMP_NUM_THREADS": "1",
                "PYTHONPATH": str(ROOT / "src")})
    if fail:
        env["FAIL"] = fail
    if locale:
        env.update({"LANG": locale, "LC_ALL": locale})
    if cache:
        env["ECOTRAIN_CACHE"] = str(cache)
    (tmp_path / "tmp").mkdir(exist_ok=True)
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    return subprocess.run([sys.executable, str(driver), *map(os.fsencode, args)], cwd=tmp_path,
                          capture_output=True, timeout=300, env=env)


def one_error_line(proc) -> str:
    err = proc.stderr.decode("utf-8", "replace")
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith("ecotrain: error:")]
    assert len(lines) == 1, err
    return lines[0]


def test_no_home_folder_trains_without_a_cache_and_says_so_once(tmp_path):
    p = homeless(tmp_path, "fit", ROOT / "recipes" / "mnist1d_cnn.yaml", "data.num_samples=300",
                 "loop.max_steps=2", "loop.eval_every=2", "ledger.enabled=false", "--run-dir", tmp_path / "run",
                 "--quiet")
    err = p.stderr.decode()
    assert p.returncode == 0, err
    assert "Traceback" not in err
    assert err.count("no home folder") == 1, err
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["steps"] == 2
    assert not list((tmp_path / "tmp").glob("ecotrain-error-*"))  # nothing failed: no error.log anywhere


def test_no_home_folder_error_boundary_writes_error_log_to_a_private_temp_folder(tmp_path):
    p = homeless(tmp_path, "card", tmp_path, fail="ecotrain.cli.commands.card:run")
    line = one_error_line(p)
    assert p.returncode == 1
    assert "card failed: ZeroDivisionError: division by zero" in line
    logs = list((tmp_path / "tmp").glob("ecotrain-error-*/error.log"))
    assert len(logs) == 1 and f"traceback in {logs[0]}" in line
    assert oct(logs[0].parent.stat().st_mode & 0o777) == "0o700"  # mkdtemp's: no other user reads it
    assert "ZeroDivisionError" in logs[0].read_text()


@pytest.fixture(scope="module")
def odd_run(tmp_path_factory):
    """A finished run in a folder named b'run-\\xff' (not UTF-8)."""
    base = tmp_path_factory.mktemp("odd")
    p = run_cli("fit", ROOT / "recipes" / "mnist1d_cnn.yaml", "data.num_samples=300", "loop.max_steps=2",
                "loop.eval_every=2", "--run-dir", base / "plain", "--quiet")
    assert p.returncode == 0, p.stderr
    shutil.move(os.fsencode(base / "plain"), os.fsencode(base) + b"/run-\xff")
    return base


@pytest.mark.parametrize("locale", ["C", "C.UTF-8"])
def test_a_run_folder_named_in_no_utf8_gets_its_card(odd_run, locale):
    env = {**os.environ, "LANG": locale, "LC_ALL": locale}
    p = subprocess.run([sys.executable, "-m", "ecotrain", "card", b"run-\xff"], cwd=odd_run, capture_output=True,
                       timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(b"model card: run-\\xff/README.md")  # the name's byte said, not a surrogate
    card = (os.fsencode(odd_run) + b"/run-\xff/README.md")
    with open(card, "rb") as f:
        text = f.read().decode("utf-8")  # valid UTF-8: a strict decode would raise
    assert 'run: "run-\\\\xff"' in text or "run: run-\\xff" in text
    assert "ecotrain ledger run-\\xff" in text


@pytest.mark.parametrize("locale", ["C", "C.UTF-8"])
def test_the_error_boundary_survives_an_undecodable_argument(tmp_path, locale):
    p = homeless(tmp_path, "card", os.fsencode(tmp_path) + b"/run-\xff", fail="ecotrain.cli.commands.card:run",
                 locale=locale)
    line = one_error_line(p)
    assert p.returncode == 1
    log = next((tmp_path / "tmp").glob("ecotrain-error-*/error.log"))
    assert "run-\\xff" in log.read_text(encoding="utf-8") and "ZeroDivisionError" in line


def test_the_cache_folder_without_a_home(monkeypatch, tmp_path):
    import pwd

    from ecotrain.accounting import meter_plan
    from ecotrain.core import threads
    from ecotrain.data import cache

    def no_entry(uid):
        raise KeyError(uid)

    for name in ("ECOTRAIN_CACHE", "XDG_CACHE_HOME", "HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    assert cache.cache_dir() is None
    assert threads.cache_file() is None and meter_plan._file({}) is None  # one owner: base/cachedir.py
    monkeypatch.setenv("HOME", "")  # empty: expanduser would make it "/", a cache at /.cache
    assert cache.cache_dir() is None
    monkeypatch.delenv("HOME")
    monkeypatch.setenv("ECOTRAIN_CACHE", "~/c")  # `~` cannot be expanded either
    assert cache.cache_dir() is None
    monkeypatch.setenv("ECOTRAIN_CACHE", str(tmp_path))
    assert cache.cache_dir() == tmp_path
    monkeypatch.delenv("ECOTRAIN_CACHE")
    monkeypatch.setenv("HOME", "home")  # a relative "home": a cache in whatever folder a run starts from is none
    assert cache.cache_dir() is None
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache.cache_dir() == tmp_path / "ecotrain"
    assert threads.cache_file() == tmp_path / "ecotrain" / "threads.json"
    assert meter_plan._file({}).parent == tmp_path / "ecotrain" / "meter"


def test_a_run_folder_named_in_no_utf8_exports(odd_run):
    env = {**os.environ, "LANG": "C", "LC_ALL": "C"}
    p = subprocess.run([sys.executable, "-m", "ecotrain", "export", b"run-\xff"], cwd=odd_run, capture_output=True,
                       timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(b"exported: run-\\xff/model.pt2")
    assert os.path.isfile(os.fsencode(odd_run) + b"/run-\xff/model.pt2")


def test_no_home_folder_meters_energy_with_a_probe_and_saves_no_plan(tmp_path):
    """The energy meter's hardware plan lives in the user cache (accounting/meter_plan.py): with none,
    CodeCarbon probes, the figure is there, and nothing is written anywhere."""
    p = homeless(tmp_path, "fit", ROOT / "recipes" / "mnist1d_cnn.yaml", "data.num_samples=300",
                 "loop.max_steps=2", "loop.eval_every=2", "--run-dir", tmp_path / "run", "--quiet", locale="C")
    err = p.stderr.decode()
    assert p.returncode == 0 and "Traceback" not in err, err
    energy = json.loads((tmp_path / "run" / "ledger.json").read_text())["energy"]
    assert energy["kwh"] and energy["kwh"] > 0 and energy["meter_startup"]["hardware"] == "probed", energy
    assert not list(tmp_path.rglob("hardware-*.json"))


def test_no_home_folder_but_a_cache_folder_saves_the_plan_and_reuses_it(tmp_path):
    """CodeCarbon reads ~/.codecarbon.config in every tracker and failed without a home: the meter
    never started (energy.py `_home_proof`). With ECOTRAIN_CACHE the plan is saved, then reused."""
    runs = []
    for name in ("a", "b"):
        p = homeless(tmp_path, "fit", ROOT / "recipes" / "mnist1d_cnn.yaml", "data.num_samples=300",
                     "loop.max_steps=2", "loop.eval_every=2", "--run-dir", tmp_path / name, "--quiet",
                     cache=tmp_path / "cache")
        assert p.returncode == 0 and "Traceback" not in p.stderr.decode(), p.stderr.decode()
        runs.append(json.loads((tmp_path / name / "ledger.json").read_text())["energy"])
    assert [e["meter_startup"]["hardware"] for e in runs] == ["probed", "cached"]
    assert all(e["kwh"] and e["kwh"] > 0 and e["missing_reason"] is None for e in runs), runs
    assert len(list((tmp_path / "cache" / "meter").glob("hardware-*.json"))) == 1


def test_an_ascii_locale_with_a_non_ascii_run_folder_fits_exports_and_cards(tmp_path):
    """LC_ALL=C with UTF-8 mode off: stdout and stderr are ASCII; a folder named "rün ✓" is said as
    \\xfc / \\u2713, never a UnicodeEncodeError (the error line too)."""
    env = {**os.environ, "LANG": "C", "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": ""}
    run = tmp_path / "rün ✓"
    p = subprocess.run([sys.executable, "-m", "ecotrain", "fit", str(ROOT / "recipes" / "mnist1d_cnn.yaml"),
                        "data.num_samples=300", "loop.max_steps=2", "loop.eval_every=2", "ledger.enabled=false",
                        "--run-dir", os.fsencode(run)], capture_output=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    assert b"run folder: " in p.stdout and b"r\\xfcn \\u2713" in p.stdout
    for cmd in (["export", os.fsencode(run)], ["card", os.fsencode(run)]):
        p = subprocess.run([sys.executable, "-m", "ecotrain", *cmd], capture_output=True, timeout=300, env=env)
        assert p.returncode == 0, p.stderr
        assert b"Traceback" not in p.stderr
    assert (run / "model.pt2").is_file() and (run / "README.md").is_file()
    p = subprocess.run([sys.executable, "-m", "ecotrain", "card", os.fsencode(tmp_path / "nö run")],
                       capture_output=True, timeout=120, env=env)
    assert p.returncode == 2 and b"Traceback" not in p.stderr and b"n\\xf6 run" in p.stderr
