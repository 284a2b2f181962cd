"""A FIFO where a file is expected (issue 44): `open()` of a named pipe with no writer blocked forever,
and the SIGTERM handler only raises a flag, so the command hung. Every path the user names is checked
before it is opened (userpath.py): one line naming the path, exit 2, at once, nothing left behind."""

import os
import time

import numpy as np
import pytest

from tests.conftest import run_cli
from tests.helpers.runs import fit_quietly, write_recipe

TINY = {"name": "tiny", "data": {"name": "digits", "batch_size": 32, "val_split": 0.1, "test_split": 0.2},
        "model": {"name": "mlp", "kwargs": {"hidden": [16]}},
        "loop": {"max_steps": 4, "max_epochs": None, "log_every": 2, "eval_every": 2},
        "logging": {"progress": "off"}, "ledger": {"energy": "off"}}
RUN = "{tmp}/run"  # a finished tiny run (the module's fixture)

CASES = {  # id: the command line ({fifo}: the pipe, {tmp}: the module's folder), and the input it names
    "recipe": (["fit", "{fifo}", "--run-dir", "{tmp}/new"], "recipe"),
    "init_from": (["fit", "{tmp}/tiny.yaml", "--run-dir", "{tmp}/new", "--init-from", "{fifo}"], "--init-from"),
    "carbon_forecast": (["fit", "{tmp}/tiny.yaml", "--run-dir", "{tmp}/new", "--carbon-forecast", "{fifo}",
                         "--deadline", "12h"], "--carbon-forecast"),
    "carbon_forecast_key": (["fit", "{tmp}/tiny.yaml", "--run-dir", "{tmp}/new", "carbon.forecast={fifo}"],
                            "carbon.forecast"),
    "green_forecast": (["green", "{tmp}/tiny.yaml", "--out", "{tmp}/new", "--carbon-forecast", "{fifo}"],
                       "--carbon-forecast"),
    "data_path": (["fit", "{tmp}/tiny.yaml", "--run-dir", "{tmp}/new", "data.name=npz", "data.path={fifo}"],
                  "data.path"),
    "predict_data": (["predict", RUN, "--data", "{fifo}", "--out", "{tmp}/p.csv"], "--data"),
    "label_map": (["review-queue", RUN, "{tmp}/x.npz", "--out", "{tmp}/q.csv", "--label-map", "{fifo}"],
                  "--label-map"),
}


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fifo")
    recipe = write_recipe(tmp, TINY)
    recipe.rename(tmp / "tiny.yaml")
    fit_quietly(tmp / "tiny.yaml", tmp / "run")
    np.savez(tmp / "x.npz", x=np.zeros((8, 64), np.float32), y=np.arange(8))
    return tmp


@pytest.mark.parametrize("case", list(CASES))
def test_a_fifo_given_as_a_file_is_one_line_at_once(home, case):
    args, what = CASES[case]
    fifo = home / f"pipe-{case}.npz"  # .npz: what --data and data.path take
    os.mkfifo(fifo)
    start = time.monotonic()
    r = run_cli(*[a.format(fifo=fifo, tmp=home) for a in args], timeout=60)  # a hang: TimeoutExpired
    took = time.monotonic() - start
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, r.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith(f"ecotrain: error: {what}: "), r.stderr
    assert str(fifo.name) in lines[0] and "is a FIFO (named pipe), not a regular file" in lines[0], lines[0]
    assert "; give " in lines[0]  # what to do
    assert took < 30, took
    assert not (home / "new").exists() and not (home / "p.csv").exists() and not (home / "q.csv").exists()
