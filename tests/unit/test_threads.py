"""threads.py: the cores a process may use (affinity, cgroup v1/v2 quota, torchrun ranks, loader workers,
other busy processes), the precedence of `threads: N` and OMP_NUM_THREADS over auto, the CLI's preset
before torch starts, fit()'s set-and-restore, and environment.json's record."""

import os
import subprocess
import sys

import pytest
import torch

from ecotrain.core import threads
from ecotrain.base.environment import capture


@pytest.fixture(autouse=True)
def _no_preset(monkeypatch):
    monkeypatch.setattr(threads, "_PRESET", None)  # each test starts as a fresh process would


def cgroup(tmp_path, **files):
    for name, text in files.items():
        (tmp_path / name.replace("__", ".")).write_text(text)
    return tmp_path


def test_quota_v2(tmp_path):
    assert threads.read_quota(cgroup(tmp_path, cpu__max="150000 100000\n")) == 1.5
    assert threads.read_quota(cgroup(tmp_path, cpu__max="max 100000\n")) is None  # "max": no quota


def test_quota_v1(tmp_path):
    folder = cgroup(tmp_path, cpu__cfs_quota_us="50000\n", cpu__cfs_period_us="100000\n")
    assert threads.read_quota(folder) == 0.5
    assert threads.read_quota(cgroup(tmp_path, cpu__cfs_quota_us="-1\n")) is None  # -1: no quota


def test_no_or_garbled_cgroup_files_mean_no_quota(tmp_path):
    assert threads.read_quota(tmp_path) is None
    assert threads.read_quota(cgroup(tmp_path, cpu__max="lots\n")) is None


def test_cores_are_the_smaller_of_affinity_and_the_quota_rounded_up(tmp_path, monkeypatch):
    monkeypatch.setattr(threads, "affinity", lambda: 8)
    monkeypatch.setenv(threads.CGROUP_ENV, str(cgroup(tmp_path, cpu__max="250000 100000")))
    assert threads.usable_cores() == (3, 8, 2.5)  # 2.5 CPUs: three threads can each get some
    monkeypatch.setenv(threads.CGROUP_ENV, str(cgroup(tmp_path, cpu__max="max 100000")))
    assert threads.usable_cores() == (8, 8, None)
    monkeypatch.setenv(threads.CGROUP_ENV, str(cgroup(tmp_path, cpu__max="20000 100000")))
    assert threads.usable_cores()[0] == 1  # a fifth of a CPU: still one thread


def test_auto_shares_cores_between_ranks_workers_and_busy_neighbours(tmp_path, monkeypatch):
    monkeypatch.setattr(threads, "affinity", lambda: 8)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    root = cgroup(tmp_path, cpu__max="max 100000")
    assert threads.choose(env={}, root=root, busy=0).threads == 8
    assert threads.choose(env={"LOCAL_WORLD_SIZE": "4"}, root=root, busy=0).threads == 2
    assert threads.choose(workers=3, env={}, root=root, busy=0).threads == 5
    busy = threads.choose(env={}, root=root, busy=6)  # six other runnable tasks leave two CPUs
    assert busy.threads == 2 and "6 runnable tasks of other processes" in busy.why()
    assert threads.choose(workers=9, env={}, root=root, busy=20).threads == 1  # never fewer than one


def test_precedence_config_then_user_omp_then_auto(tmp_path):
    root = cgroup(tmp_path, cpu__max="100000 100000")  # one CPU
    c = threads.choose(3, env={"OMP_NUM_THREADS": "5"}, root=root, busy=0)
    assert (c.threads, c.source) == (3, "config")
    c = threads.choose("auto", env={"OMP_NUM_THREADS": "5"}, root=root, busy=0)
    assert (c.threads, c.source) == (5, "OMP_NUM_THREADS") and c.why() == "OMP_NUM_THREADS=5 set by the user"
    c = threads.choose("auto", env={}, root=root, busy=0)
    assert (c.threads, c.source, c.quota) == (1, "auto", 1.0)


def test_preset_env_leaves_the_users_value_and_is_not_read_back_as_the_users(tmp_path):
    env = {}
    choice = threads.choose(env=env, root=cgroup(tmp_path, cpu__max="200000 100000"), busy=0)
    threads.preset_env(choice, env)
    assert env == {"OMP_NUM_THREADS": str(choice.threads), "MKL_NUM_THREADS": str(choice.threads)}
    assert threads.choose(env=env, root=tmp_path, busy=0).source == "auto"  # ours, not the user's
    user = {"OMP_NUM_THREADS": "7"}
    threads.preset_env(threads.choose(env=user, root=tmp_path, busy=0), user)
    assert user == {"OMP_NUM_THREADS": "7"}


def test_for_fit_sets_torch_threads_for_the_call_and_restores_them(monkeypatch):
    before = torch.get_num_threads()
    with threads.for_fit(before + 1) as choice:
        assert torch.get_num_threads() == choice.threads == before + 1 and choice.source == "config"
    assert torch.get_num_threads() == before


def test_environment_json_records_the_choice_and_why(tmp_path):
    choice = threads.choose(env={}, root=cgroup(tmp_path, cpu__max="100000 100000"), busy=0)
    hw = capture(threads=choice)["hardware"]
    assert hw["threads"]["threads"] == 1 and hw["threads"]["quota"] == 1.0
    assert hw["threads"]["why"].startswith("1 of 1 usable cores") and "cgroup quota 1 CPUs" in hw["threads"]["why"]


PRINT_CHOICE = ("from ecotrain.core import threads; c = threads.choose(busy=0); "
                "print(c.threads, c.cores, c.affinity, c.source)")


def test_a_real_taskset_mask_limits_the_threads():
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", threads.CGROUP_ENV)}
    out = subprocess.run(["taskset", "-c", "0", sys.executable, "-c", PRINT_CHOICE], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "1", "1", "auto"]


def test_the_cgroup_override_variable_simulates_a_quota(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env[threads.CGROUP_ENV] = str(cgroup(tmp_path, cpu__cfs_quota_us="100000", cpu__cfs_period_us="100000"))
    out = subprocess.run([sys.executable, "-c", PRINT_CHOICE], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[:2] == ["1", "1"]


def test_a_resume_under_auto_keeps_the_checkpoints_thread_count(tmp_path, monkeypatch):
    """Exact resume: the load may have changed since the checkpoint was saved; auto must not change
    the count (another count sums CPU reductions in another order)."""
    import json

    import torch

    from ecotrain.core import threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    ckpt = tmp_path / "step-00000004"
    ckpt.mkdir()
    (ckpt / "meta.json").write_text(json.dumps({"env": {"threads": 3}}))
    before = torch.get_num_threads()
    with threads.for_fit("auto", 0, resume=ckpt) as choice:
        assert choice.threads == 3 and choice.source == "resume" and torch.get_num_threads() == 3
        assert "as when the checkpoint resumed from was saved" in choice.why()
    assert torch.get_num_threads() == before
    with threads.for_fit(2, 0, resume=ckpt) as choice:  # an explicit count still wins
        assert choice.threads == 2 and choice.source == "config"
    (ckpt / "meta.json").write_text("{not json")
    assert threads.recorded(ckpt) is None and threads.recorded(tmp_path / "nowhere") is None
