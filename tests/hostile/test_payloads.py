"""No code runs from a file ecotrain reads: every payload of tests/helpers/payloads.py, through the real
CLI, is refused in one line with a non-zero exit, and its marker file is never created."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_digits

from tests.conftest import run_cli
from tests.helpers import payloads
from tests.hostile.cases import TINY

pytestmark = pytest.mark.hostile


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("payloads")
    (tmp / "tiny.yaml").write_text(TINY)
    run = tmp / "run"
    done = run_cli("fit", tmp / "tiny.yaml", "--run-dir", run)
    assert done.returncode == 0, done.stderr
    done = run_cli("export", run, "--format", "pt2", "--out", tmp / "clean.pt2", "--no-card")
    assert done.returncode == 0, done.stderr
    np.savez(tmp / "q.npz", x=load_digits().data[:8].astype(np.float32))
    return tmp, payloads.build_all(tmp, run, tmp / "clean.pt2", tmp / "q.npz")


def test_the_clean_export_predicts(hostile):
    tmp, _ = hostile
    done = run_cli("predict", tmp / "clean.pt2", "--data", tmp / "q.npz", "--out", tmp / "clean.csv")
    assert done.returncode == 0, done.stderr
    assert len((tmp / "clean.csv").read_text().splitlines()) == 9


@pytest.mark.parametrize("case", payloads.IDS)
def test_a_payload_is_refused_and_never_runs(hostile, case):
    tmp, cases = hostile
    done = run_cli(*cases[case])
    errors = [line for line in done.stderr.splitlines() if line.startswith("ecotrain: error:")]
    assert done.returncode in (2, 3), done.stderr
    assert "Traceback" not in done.stderr and len(errors) == 1, done.stderr
    assert case not in payloads.markers_made(tmp), f"the payload of {case} ran"
