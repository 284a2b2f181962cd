"""Inputs that lie (issue 44): each is one line (what, where, what to do) or the right answer said so,
never a silent wrong answer nor an internal error. The cases run through test_hostile.py's harness (exit
code, one error line, every file it was given unchanged, nothing left behind); the promises that take
more than one command (the same predictions whatever the column order, a stop signal during `report`)
are tests of their own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ROOT, run_cli
from tests.hostile import test_hostile as harness
from tests.hostile.cases import (FIT, NO_RUN, RANDOM_BYTES, RUN, TINY, Case, both, copy, edit_json, npz, trained_run,
                                 write)
from tests.hostile.cases_commands import REG, registry

pytestmark = pytest.mark.hostile

_X = np.random.default_rng(0).normal(size=(60, 3))


def table(name: str, header: str, cols: str, label: bool = True, rows: int = 60):
    """A CSV of the same 60 samples, its columns in the order `cols` names (a, b, c: the features; l: label)."""
    def cell(r: int, c: str) -> str:
        return str(r % 3) if c == "l" else repr(float(_X[r, "abc".index(c)]))

    body = "".join(",".join(cell(r, c) for c in cols if label or c != "l") + "\n" for r in range(rows))
    return write(name, header + "\n" + body)


TRAIN_CSV = table("train.csv", "a,b,label,c", "ablc")
CSV_RUN = both(TRAIN_CSV, trained_run("run", "data.name=csv", "data.path=train.csv", inputs=TRAIN_CSV))
PREDICT = ["predict", "{tmp}/run", "--out", "{tmp}/p.csv", "--data"]
NO_PREDS = ("p.csv", ".p.csv.tmp-*")



GREEN = ["green", "{tmp}/tiny.yaml", "--out", "{tmp}/g", "--seeds-confirm", "0", "--check-seeds", "none"]
CASES = [
    # ---- 1. a CSV's columns are the model's input contract, by name ----
    Case("predict_csv_columns_in_another_order", [*PREDICT, "{tmp}/swap.csv"], 0,
         ["columns in another order", "read by name, as a, b, c", "wrote 5 predictions"],
         both(CSV_RUN, table("swap.csv", "c,b,a", "cba", rows=5))),
    Case("eval_csv_columns_in_another_order", ["eval", "{tmp}/run", "--data", "{tmp}/swap.csv", "--out",
                                               "{tmp}/e.json"], 0, ["read by name, as a, b, c", "all_accuracy"],
         both(CSV_RUN, table("swap.csv", "label,c,a,b", "lcab"))),
    Case("predict_csv_missing_a_column", [*PREDICT, "{tmp}/miss.csv"], 2,
         ["miss.csv", "no column 'c'", "takes the columns a, b, c", "by name"],
         both(CSV_RUN, table("miss.csv", "b,a", "ba", rows=5)), absent=NO_PREDS),
    Case("predict_csv_with_an_unknown_column", [*PREDICT, "{tmp}/more.csv"], 2,
         ["more.csv", "column 'label2' the model was not trained on", "a, b, c"],
         both(CSV_RUN, table("more.csv", "a,b,c,label2", "abcl", rows=5)), absent=NO_PREDS),
    Case("predict_csv_of_a_run_from_before_names_were_kept", [*PREDICT, "{tmp}/swap.csv"], 0,
         ["read by name, as a, b, c"],  # its training file, read again, says them
         both(CSV_RUN, edit_json("run/summary.json", lambda s: s.pop("inputs")), table("swap.csv", "c,a,b", "cab"))),
    Case("predict_csv_named_twice", [*PREDICT, "{tmp}/twice.csv"], 2, ["twice.csv", "column 'a' is named 2 times"],
         both(CSV_RUN, write("twice.csv", "a,b,a\n1,2,3\n")), absent=NO_PREDS),
    Case("predict_with_a_damaged_summary", [*PREDICT, "{tmp}/swap.csv"], 2,
         ["summary.json", "'inputs.columns.0' is 1, not text"],
         both(CSV_RUN, edit_json("run/summary.json", lambda s: s.update(inputs={"columns": [1, 2, 3]})),
              table("swap.csv", "c,b,a", "cba", rows=5)), absent=NO_PREDS),

    # ---- 3. data that cannot mean anything ----
    Case("npz_features_of_width_0", [*FIT, "data.name=npz", "data.path={tmp}/w0.npz", *RUN], 2,
         ["w0.npz", "shape (60, 0)", "no features at all"],
         npz("w0.npz", x=np.zeros((60, 0), np.float32), y=np.arange(60) % 3), absent=NO_RUN),
    Case("csv_label_column_named_twice", [*FIT, "data.name=csv", "data.path={tmp}/t.csv", *RUN], 2,
         ["t.csv", "column 'label' is named 2 times", "columns 2, 4", "rename or drop"],
         table("t.csv", "a,label,b,label", "albl"), absent=NO_RUN),

    # ---- 2. a seed group of one run ----
    Case("compare_one_run_given_twice", ["compare", "--baseline", "{tmp}/run", "{tmp}/run", "--candidate",
                                         "{tmp}/run"], 2, ["baseline runs", "one run folder given 2 times",
                                                           "no verdict"], trained_run()),
    Case("compare_copies_of_one_seed", ["compare", "{tmp}/run,{tmp}/r2,{tmp}/r3", "{tmp}/run"], 2,
         ["r2", "r3", "all trained seed 0", "distinct seeds", "no verdict"],
         both(trained_run(), copy("run", "r2"), copy("run", "r3"))),

    # ---- 4. a registry index that lies ----
    Case("registry_current_names_a_missing_version", ["versions", *REG], 3,
         ["index.json", "'current' names v0009", "(v0001)", "set it to one of them"],
         both(registry(), edit_json("reg/index.json", lambda i: i.update(current="v0009")))),
    Case("registry_index_without_history", ["rollback", *REG], 3,
         ["index.json", "no 'history'", 'add "history": []'],
         both(registry(), edit_json("reg/index.json", lambda i: i.pop("history")))),

    # ---- 5. green ----
    Case("green_damaged_study_db", GREEN, 2, ["study.db", "damaged", "file is not a database", "move it away"],
         write("g/study.db", RANDOM_BYTES), absent=("g/baseline",)),
    Case("green_tolerance_nan", [*GREEN, "--tolerance", "nan"], 2, ["--tolerance nan", "finite"], absent=("g",)),
    Case("green_budget_nan", [*GREEN, "--budget-runs", "nan"], 2, ["--budget-runs nan", "finite"], absent=("g",)),
    # the plan's region is read before the search trains, not after it (the whole search spent first)
    Case("green_plan_region_unknown", [*GREEN, "--plan-region", "ZZ"], 2,
         ["--plan-region ZZ", "not in CodeCarbon's grid data"], absent=("g",)),
    Case("threads_objective_misspelt", [*FIT, *RUN], 2, ["ECOTRAIN_THREADS_FOR=enrgy", "one of energy, time, money"],
         env={"ECOTRAIN_THREADS_FOR": "enrgy"}, absent=NO_RUN),
    Case("green_plan_region_empty", [*GREEN, "--plan-region", ""], 2, ["--plan-region is empty"], absent=("g",)),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_lie(case: Case, tmp_path: Path):
    harness.test_hostile(case, tmp_path)


def test_the_case_ids_are_new():
    assert not {c.id for c in CASES} & {c.id for c in harness.ALL}


def test_the_same_samples_in_any_column_order_get_the_same_predictions(tmp_path):
    """The promise behind `predict_csv_columns_in_another_order`: not only accepted, the same answer."""
    CSV_RUN(tmp_path)
    (tmp_path / "tiny.yaml").write_text(TINY)
    for name, header, cols in (("same", "a,b,c", "abc"), ("swap", "c,a,b", "cab")):
        table(f"{name}.csv", header, cols, label=False, rows=20)(tmp_path)
        r = run_cli("predict", tmp_path / "run", "--data", tmp_path / f"{name}.csv", "--out",
                    tmp_path / f"p-{name}.csv", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
    assert (tmp_path / "p-same.csv").read_text() == (tmp_path / "p-swap.csv").read_text()
    assert "read by name" not in run_cli("predict", tmp_path / "run", "--data", tmp_path / "same.csv", "--out",
                                         tmp_path / "p-again.csv", cwd=tmp_path).stderr  # said only when reordered


def _catches_sigterm(pid: int) -> bool:
    """Whether the process has its own SIGTERM handler yet (cli.main installs it first thing)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("SigCgt:")), 16)
    return bool(caught & (1 << (signal.SIGTERM - 1)))


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc/PID/status (Linux)")
@pytest.mark.parametrize("after", [0.0, 0.05, 0.15, 0.3, "done"])
def test_sigterm_during_report_exits_130_and_writes_nothing_partial(tmp_path, after):
    """A stop signal at any point once `ecotrain report` has its handler: exit 130 with report.html absent
    (never half-written, no temporary left), or, once the report is written, its own exit 0; never killed
    by the signal (-15). A signal inside the matplotlib import used to be swallowed there (exit 1 with an
    unrelated error), one during the interpreter's teardown killed a finished report."""
    trained_run()(tmp_path)
    out = tmp_path / "r.html"
    p = subprocess.Popen([sys.executable, "-m", "ecotrain", "report", str(tmp_path / "run"), "--out", str(out)],
                         cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not _catches_sigterm(p.pid) and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        if after == "done":
            line = p.stdout.readline()  # the command's last line: written, then the interpreter's teardown
            assert line.startswith("report: "), line
        else:
            time.sleep(after)
        p.send_signal(signal.SIGTERM)
        stdout, stderr = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode in (0, 130), f"exit {p.returncode}\n{stderr}"
    assert "Traceback" not in stderr and "error" not in stderr, stderr
    assert not list(tmp_path.glob(".r.html*")), "a temporary was left behind"
    if p.returncode == 130:
        assert stderr.strip().splitlines()[-1] == "ecotrain: interrupted", stderr
    if out.exists():
        assert out.read_text().rstrip().endswith("</html>")
    else:
        assert p.returncode == 130
    if after == "done":
        assert p.returncode == 0 and out.exists()
