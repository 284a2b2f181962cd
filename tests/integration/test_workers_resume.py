"""Loader workers on a streamed Parquet source, through the real CLI: a SIGKILL mid-epoch and a
SIGTERM sent to the whole process group both resume to the uninterrupted run's bytes, and no
worker outlives the run."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from ecotrain import Callback
from tests.helpers.runs import deterministic_lines

ROOT = Path(__file__).resolve().parents[2]


class SignalGroupAt(Callback):
    """At the end of step `step`, send `sig` to this process's whole group (workers included), as a
    scheduler's preemption does."""

    def __init__(self, step: int, sig: str = "SIGTERM"):
        self.step, self.sig = step, getattr(signal, sig)

    def on_step_end(self, state):
        if state.step == self.step:
            os.killpg(os.getpgid(0), self.sig)


def _shards(folder):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir()
    rng = np.random.default_rng(1)
    for s in range(3):
        x = rng.normal(size=(200, 10)).astype(np.float32)
        y = (x[:, 0] + x[:, 1] > 0).astype(np.int64)
        t = pa.table({"x": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 10), "label": y})
        pq.write_table(t, folder / f"s{s}.parquet", row_group_size=50)


def _recipe(tmp, data, callbacks=()):
    tree = {"name": "workers", "seed": 2,
            "data": {"name": f"parquet:{data}", "batch_size": 24, "workers": 2, "shuffle_window": 96},
            "model": {"name": "mlp", "kwargs": {"hidden": [16]}, "dropout": 0.1},
            "loop": {"max_steps": 30, "max_epochs": None, "log_every": 5, "eval_every": 10},
            "checkpoint": {"every_n_steps": 4}, "ledger": {"enabled": False}, "callbacks": list(callbacks)}
    p = tmp / f"recipe-{len(list(tmp.iterdir()))}.yaml"
    p.write_text(yaml.safe_dump(tree))
    return p


def _fit(*args):
    """The CLI in its own process group (a group signal must not reach pytest)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "ecotrain", "fit", *map(str, args), "--quiet"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=env, start_new_session=True)


def _survivors(marker: str) -> list[int]:
    """Processes still running whose command line names this run (a worker is a fork of the CLI)."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit() and int(p.name) != os.getpid():
            try:
                if marker in (p / "cmdline").read_bytes().decode(errors="replace"):
                    out.append(int(p.name))
            except OSError:
                pass
    return out


def _no_survivors(marker: str) -> None:
    deadline = time.time() + 5
    while _survivors(marker) and time.time() < deadline:
        time.sleep(0.1)
    assert not _survivors(marker)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("workers")
    _shards(tmp / "data")
    r = _fit(_recipe(tmp, tmp / "data"), "--run-dir", tmp / "ref")
    assert r.returncode == 0, r.stderr
    return tmp


@pytest.mark.parametrize("killer, rc", [
    ({"path": "tests.helpers.killer:KillAt", "kwargs": {"step": 14}}, -signal.SIGKILL),
    ({"path": "tests.integration.test_workers_resume:SignalGroupAt", "kwargs": {"step": 17}}, 75),
])
def test_killed_with_workers_resumes_to_the_same_bytes(setup, tmp_path, killer, rc):
    run = tmp_path / "run"
    r = _fit(_recipe(tmp_path, setup / "data", [killer]), "--run-dir", run)
    assert r.returncode == rc, r.stderr
    assert "Traceback" not in r.stderr  # SIGTERM reached the workers too: the loader did not fail
    _no_survivors(str(tmp_path))
    r = _fit(_recipe(tmp_path, setup / "data"), "--run-dir", run, "--resume", "auto", "--allow-config-change")
    assert r.returncode == 0, r.stderr
    ref = setup / "ref"
    assert (run / "model.safetensors").read_bytes() == (ref / "model.safetensors").read_bytes()
    assert deterministic_lines(run) == deterministic_lines(ref)
    _no_survivors(str(tmp_path))
