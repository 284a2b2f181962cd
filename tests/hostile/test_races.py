"""Commands racing on one run folder: the folder's lock covers each writer's whole life, from its
first decision (is the run finished? which checkpoint?) to its last rename. Started together, every
command either does its work or says in one line that the folder is busy; a finished run is never
rewritten by a resume; a user's hard link to a run file never changes. The long version, 50 and more
cycles killed at random with two racers: `python bench/soak.py --racers 2`."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli
from tests.hostile.cases import TINY

pytestmark = pytest.mark.hostile
BUSY = "is writing this run folder"


def _start(*args) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "ecotrain", *map(str, args)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _digest(run: Path) -> dict:
    return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run.rglob("*")) if p.is_file() and p.name != ".ecotrain.lock" and p.name != "report.html"}


def test_resumers_and_a_report_started_together_on_a_finished_run_lose_nothing(tmp_path):
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(TINY)
    run = tmp_path / "run"
    assert run_cli("fit", recipe, "--run-dir", run, "--quiet").returncode == 0
    before = _digest(run)
    outcomes = []
    for _ in range(2):
        procs = [_start("resume", run, "--quiet"), _start("fit", recipe, "--run-dir", run, "--resume", "auto", "--quiet"),
                 _start("report", run)]
        for p in procs:
            out, err = p.communicate(timeout=300)
            lines = [ln for ln in err.splitlines() if ln.startswith("ecotrain: error")]
            ok = p.returncode == 0 or (p.returncode == 2 and len(lines) == 1 and BUSY in lines[0])
            assert ok and "Traceback" not in err, (p.args, p.returncode, err[-1500:])
            outcomes.append(p.returncode)
        assert _digest(run) == before  # the finished run: not one byte rewritten
    assert 0 in outcomes


def test_a_second_fit_while_the_first_trains_is_refused_in_one_line(tmp_path):
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(TINY)
    run = tmp_path / "run"
    first = _start("fit", recipe, "--run-dir", run, "--quiet", "loop.max_steps=4000", "loop.max_epochs=null")
    try:
        while not (run / "config.yaml").exists():  # accepted: training starts
            assert first.poll() is None, first.communicate()[1]
            time.sleep(0.05)
        second = run_cli("fit", recipe, "--run-dir", run, "--resume", "auto", "--quiet")
        lines = second.stderr.strip().splitlines()
        assert second.returncode == 2 and len(lines) == 1 and BUSY in lines[0], second.stderr
    finally:
        first.kill()
        first.communicate()


def test_a_hard_linked_run_file_keeps_the_users_copy(tmp_path):
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(TINY)
    run = tmp_path / "run"
    assert run_cli("fit", recipe, "--run-dir", run, "--quiet", "loop.max_steps=3", "loop.max_epochs=null").returncode == 0
    backup = tmp_path / "metrics-backup.jsonl"
    os.link(run / "metrics.jsonl", backup)
    kept = backup.read_bytes()
    r = run_cli("resume", run, "--quiet", "loop.max_steps=6", "--allow-config-change")
    assert r.returncode == 0, r.stderr
    assert backup.read_bytes() == kept and (run / "metrics.jsonl").read_bytes() != kept
