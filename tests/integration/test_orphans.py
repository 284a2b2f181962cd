"""Child processes end with their parent and leave nothing (orphans.py): a `memory.budget` measuring
worker and the DataLoader's workers, after a real SIGKILL of the ecotrain process that started them."""

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT
from tests.helpers.children import children
from tests.helpers.runs import write_recipe

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

TINY = ["data.kwargs.seq_len=128", "data.kwargs.max_bytes=60000", "model.kwargs.d_model=32", "model.kwargs.n_layers=2",
        "model.kwargs.n_heads=2", "data.batch_size=4", "loop.eval_every=null", "ledger.energy=off", "precision=fp32"]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


def wait_for(what, timeout: float, every: float = 0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = what()
        if got:
            return got
        time.sleep(every)
    return what()


def test_a_measuring_worker_ends_with_its_killed_parent_and_removes_its_folder(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "OMP_NUM_THREADS": "1"}
    # many measured steps: the worker is still training when its parent is killed
    parent = subprocess.Popen([sys.executable, "-m", "ecotrain", "plan", "recipes/charlm_long.yaml", *TINY,
                               "memory.search_steps=100000", "--budget", "64GiB", "--measure"], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        folders = wait_for(lambda: list(tmp.glob("ecotrain-memplan-*/run")), 120)  # the worker is in fit()
        assert folders, parent.stderr.read().decode() if parent.poll() is not None else "no worker started"
        worker = children(parent.pid)
        assert len(worker) == 1
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)
        assert wait_for(lambda: not alive(worker[0]), 30), "the worker outlived its killed parent"
        # its folder is gone (torch's own caches there, torchinductor_*, are meant to stay)
        assert wait_for(lambda: not list(tmp.glob("ecotrain-*")), 10), list(tmp.iterdir())
    finally:
        parent.kill()
        parent.wait()


def test_dataloader_workers_end_with_their_killed_parent(cli, tmp_path):
    noted = tmp_path / "children"
    recipe = write_recipe(tmp_path, {
        "name": "orphans", "data": {"name": "digits", "batch_size": 32, "workers": 2},
        "model": {"name": "mlp", "kwargs": {"hidden": [8]}},
        "loop": {"max_steps": 50, "max_epochs": None, "eval_every": 1000}, "logging": {"progress": "off"},
        "ledger": {"enabled": False},
        "callbacks": [{"path": "tests.helpers.children:NoteChildrenThenKill",
                       "kwargs": {"step": 5, "out": str(noted)}}]})
    r = cli("fit", recipe, "--run-dir", tmp_path / "run", "--quiet")
    assert r.returncode == -signal.SIGKILL, r.stderr
    pids = [int(p) for p in noted.read_text().split()]
    assert len(pids) >= 2  # the two loader workers (and torch's pin-memory thread is no process)
    # PR_SET_PDEATHSIG: the kernel ends them with the parent, not torch's 5 s watchdog
    assert wait_for(lambda: not any(alive(p) for p in pids), 3), [p for p in pids if alive(p)]


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/unshare"), reason="needs root for a pid namespace")
def test_loader_workers_run_when_ecotrain_is_pid_1(tmp_path):
    """A container's entry point is pid 1: its workers' parent is pid 1, which is no sign it died."""
    recipe = write_recipe(tmp_path, {
        "name": "pid1", "data": {"name": "digits", "batch_size": 32, "workers": 2},
        "model": {"name": "mlp", "kwargs": {"hidden": [8]}}, "loop": {"max_steps": 5, "max_epochs": None},
        "logging": {"progress": "off"}, "ledger": {"enabled": False}})
    r = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-m", "ecotrain", "fit", recipe,
                        "--run-dir", tmp_path / "run", "--quiet"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr


def test_a_killed_runs_loader_workers_do_not_keep_its_folder_locked(tmp_path):
    """torch forks a user's DataLoader workers, and a fork shares the run folder's flock: they used to
    hold it until their watchdog ended them (up to 5 s), and a resume started at once was refused."""
    import fcntl

    run = tmp_path / "run"
    # no pipes: the workers would hold them too, and the wait would end only with the workers
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "helpers" / "user_program.py"), "shuffle2", str(run),
                        "--kill-after", "3"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == -signal.SIGKILL
    fd = os.open(run / ".ecotrain.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: a process still holds it
    finally:
        os.close(fd)
