"""Real `torchrun` with several processes on CPU (gloo): DDP, FSDP2, two "nodes" on loopback,
kill-and-resume, preemption of one rank, a dead rank, and the errors."""

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from tests.helpers.runs import deterministic_lines

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}

MLP = {
    "name": "dist", "seed": 1,
    "data": {"name": "digits", "batch_size": 64, "val_split": 0.15},
    "model": {"name": "mlp", "kwargs": {"hidden": [32]}},
    "optim": {"lr": 3e-3},
    "loop": {"max_steps": 16, "max_epochs": None, "log_every": 4, "eval_every": 8},
    "logging": {"progress": "off"},
}
CHARLM = {
    "name": "dist_lm", "seed": 1,
    "data": {"name": "text", "batch_size": 8, "val_split": 0.1, "kwargs": {"seq_len": 32, "max_bytes": 40000}},
    "model": {"name": "charlm", "kwargs": {"d_model": 32, "n_layers": 2, "n_heads": 2}},
    "optim": {"lr": 3e-3},
    "loop": {"max_steps": 8, "max_epochs": None, "log_every": 4, "eval_every": 4},
    "logging": {"progress": "off"},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def recipe(tmp_path, base, **sections):
    tree = json.loads(json.dumps(base))
    for k, v in sections.items():
        tree[k] = {**tree.get(k, {}), **v} if isinstance(v, dict) else v
    p = tmp_path / f"recipe-{len(list(tmp_path.glob('recipe-*')))}.yaml"
    p.write_text(yaml.safe_dump(tree))
    return p


def run_group(cmd, timeout, cwd=ROOT, env=None):
    """subprocess.run, but a timeout kills the whole process group: no orphaned ranks left behind."""
    p = subprocess.Popen(cmd, cwd=cwd, env=env or ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        pytest.fail(f"timed out after {timeout}s: {' '.join(cmd)}\n{err[-3000:]}")
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def torchrun(*args, nproc=2, timeout=240, extra=(), cwd=ROOT):
    cmd = [*TORCHRUN, "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           *extra, "-m", "ecotrain", *map(str, args)]
    return run_group(cmd, timeout, cwd)


def single(*args, timeout=240):
    return subprocess.run([sys.executable, "-m", "ecotrain", *map(str, args)], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=timeout)


lines = deterministic_lines


def assert_close_runs(a, b, tol=1e-5, after=0):
    la, lb = ([x for x in lines(r) if x["step"] > after] for r in (a, b))
    assert [sorted(x) for x in la] == [sorted(x) for x in lb]
    for x, y in zip(la, lb):
        for k in x:
            assert x[k] == pytest.approx(y[k], rel=tol, abs=tol), (k, x, y)
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert set(wa) == set(wb)
    for k in wa:
        assert torch.allclose(wa[k], wb[k], atol=tol), k


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    d = tmp_path_factory.mktemp("single")
    r = single("fit", recipe(d, MLP), "--run-dir", d / "run", "--quiet")
    assert r.returncode == 0, r.stderr
    return d / "run"


def test_ddp_two_ranks_equal_one_process_with_the_same_global_batch(tmp_path, one_process):
    r = torchrun("fit", recipe(tmp_path, MLP, distributed={"strategy": "ddp"}), "--run-dir", tmp_path / "run", "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("test_accuracy") == 1  # rank 0 alone reports
    assert_close_runs(tmp_path / "run", one_process)
    ledger = json.loads((tmp_path / "run" / "ledger.json").read_text())
    memory, energy = ledger["memory"], ledger["energy"]  # every rank's peak, the largest on top
    assert len(memory["per_rank"]) == 2
    assert memory["host_peak_rss_bytes"] == max(r["host_peak_rss_bytes"] for r in memory["per_rank"]) > 0
    if energy["kwh"] is not None:  # CodeCarbon's estimate on this machine: every rank's own, summed
        assert energy["ranks"] == 2 and energy["kwh"] == pytest.approx(sum(energy["per_rank_kwh"]))
    else:
        assert energy["missing_reason"]


def test_fsdp_trains_checkpoints_shards_resumes_and_matches(tmp_path, one_process):
    rec = recipe(tmp_path, MLP, distributed={"strategy": "fsdp"}, checkpoint={"every_n_steps": 8})
    run = tmp_path / "run"
    r = torchrun("fit", rec, "--run-dir", run, "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    assert_close_runs(run, one_process)
    shards = sorted(p.name for p in (run / "checkpoints" / "step-00000008" / "shards").iterdir())
    assert len(shards) == 2 and all(s.endswith(".safetensors") for s in shards)  # one per rank, no pickle
    # resume from step 8 at the same world size: bit-identical
    final = (run / "model.safetensors").read_bytes()
    for p in ("step-00000016",):
        import shutil
        shutil.rmtree(run / "checkpoints" / p)
    (run / "model.safetensors").unlink()
    r = torchrun("fit", rec, "--run-dir", run, "--resume", "auto", "--quiet")
    assert r.returncode == 0 and "step-00000008" in r.stderr, r.stderr[-3000:]
    assert (run / "model.safetensors").read_bytes() == final
    # and at a different world size: 2 ranks -> 1 process (DCP reshards)
    one = tmp_path / "one"
    (one / "checkpoints").mkdir(parents=True)
    shutil.copytree(run / "checkpoints" / "step-00000008", one / "checkpoints" / "step-00000008")
    r = single("fit", recipe(tmp_path, MLP), "--run-dir", one, "--resume", "auto", "--allow-config-change", "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    assert_close_runs(one, one_process, after=8)
    assert json.loads((one / "summary.json").read_text())["world_size"] == 1  # this segment's, not the saved 2


def test_without_run_dir_rank_zero_picks_one_folder_for_all(tmp_path):
    """Each rank used to pick its own timestamped folder; rank 0 decides and broadcasts."""
    r = torchrun("fit", recipe(tmp_path, MLP, distributed={"strategy": "ddp"}, loop={"max_steps": 4}), "--quiet",
                 cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    folders = list((tmp_path / "runs").iterdir())
    assert len(folders) == 1 and (folders[0] / "summary.json").is_file(), folders


def test_fsdp_trains_the_char_transformer(tmp_path):
    r = torchrun("fit", recipe(tmp_path, CHARLM, distributed={"strategy": "fsdp"}, checkpoint={"every_n_steps": 4}),
                 "--run-dir", tmp_path / "fsdp", "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    r = torchrun("fit", recipe(tmp_path, CHARLM, distributed={"strategy": "ddp"}), "--run-dir", tmp_path / "ddp", "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    assert_close_runs(tmp_path / "fsdp", tmp_path / "ddp", tol=1e-4)
    first, last = lines(tmp_path / "fsdp")[0]["loss"], lines(tmp_path / "fsdp")[-2]["loss"]
    assert last < first  # it learns


def test_two_nodes_on_loopback(tmp_path, one_process):
    port, rec = free_port(), recipe(tmp_path, MLP, distributed={"strategy": "ddp"})
    procs = [subprocess.Popen([*TORCHRUN, "--nnodes", "2", "--node-rank", str(n), "--nproc-per-node", "1",
                               "--master-addr", "127.0.0.1", "--master-port", str(port),
                               "-m", "ecotrain", "fit", str(rec), "--run-dir", str(tmp_path / "run"), "--quiet"],
                              cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for n in (0, 1)]
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    assert_close_runs(tmp_path / "run", one_process)


def test_ddp_kill_and_resume_is_exact(tmp_path):
    base = recipe(tmp_path, MLP, distributed={"strategy": "ddp"}, checkpoint={"every_n_steps": 3})
    ref = tmp_path / "ref"
    assert torchrun("fit", base, "--run-dir", ref, "--quiet").returncode == 0
    run = tmp_path / "run"
    killer = recipe(tmp_path, MLP, distributed={"strategy": "ddp"}, checkpoint={"every_n_steps": 3},
                    callbacks=[{"path": "tests.helpers.killer:KillAt", "kwargs": {"step": 11}}])
    assert torchrun("fit", killer, "--run-dir", run, "--quiet").returncode != 0
    r = torchrun("fit", base, "--run-dir", run, "--resume", "auto", "--allow-config-change", "--quiet")
    assert r.returncode == 0 and "step-00000009" in r.stderr, r.stderr[-3000:]
    assert (run / "model.safetensors").read_bytes() == (ref / "model.safetensors").read_bytes()
    assert lines(run) == lines(ref)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_sigterm_on_one_rank_checkpoints_all_ranks_at_one_step(tmp_path, strategy):
    """The ranks agree on stop requests at agreement steps (distributed.Agreement, at most
    AGREE_MAX_STEPS apart), not every step: the run stops at one step >= 6, on every rank
    (FSDP: each rank writes its shard into that one step's folder)."""
    from ecotrain.core.distributed import AGREE_MAX_STEPS
    rec = recipe(tmp_path, MLP, distributed={"strategy": strategy}, loop={"max_steps": 6 + AGREE_MAX_STEPS + 10},
                 callbacks=[{"path": "tests.helpers.killer:KillAt", "kwargs": {"step": 6, "sig": "SIGTERM", "rank": 1}}])
    run = tmp_path / "run"
    r = torchrun("fit", rec, "--run-dir", run, "--quiet")
    assert r.returncode != 0  # torchrun reports the workers' exit code 75 as a failure of the group
    assert "exitcode  : 75" in r.stderr or "exit code 75" in r.stderr or "75" in r.stderr
    ckpts = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert len(ckpts) == 1 and 6 <= int(ckpts[0].split("-")[1]) <= 6 + AGREE_MAX_STEPS, ckpts
    if strategy == "fsdp":
        assert len(list((run / "checkpoints" / ckpts[0] / "shards").iterdir())) == 2
    assert not (run / "summary.json").exists()


def test_no_collective_on_every_step(tmp_path):
    """Besides DDP's gradient all-reduce, the loop's collectives (logging, evaluation, the stop
    agreement, the divergence guard) come every few steps, not on every step."""
    rec = recipe(tmp_path, MLP, distributed={"strategy": "ddp"}, loop={"max_steps": 80, "log_every": 40, "eval_every": 40},
                 callbacks=[{"path": "tests.helpers.collectives:CountCollectives"}])
    run = tmp_path / "run"
    r = torchrun("fit", rec, "--run-dir", run, "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    for rank in (0, 1):
        c = json.loads((run / f"collectives-{rank}.json").read_text())
        assert c["steps"] == 80 and c["collectives"] <= 20, c


@pytest.mark.parametrize("action", ["stop", "skip"])
def test_a_nan_loss_on_one_rank_is_never_applied_and_all_ranks_decide_alike(tmp_path, action):
    """DDP: the all-reduced gradients are the same on every rank, so each rank checks them alone,
    with no collective per step, and all skip (or stop at) the same step."""
    model = {"name": "tests.helpers.poison:PoisonOnRank", "kwargs": {"at": [5, 7], "rank": 1}}
    rec = recipe(tmp_path, MLP, model=model, distributed={"strategy": "ddp"}, loop={"max_steps": 10},
                 divergence={"action": action})
    run = tmp_path / "run"
    r = torchrun("fit", rec, "--run-dir", run, "--quiet")
    s = json.loads((run / "summary.json").read_text())
    if action == "stop":
        assert r.returncode != 0 and s["stopped_because"] == "diverged" and s["steps"] == 5, r.stderr[-3000:]
    else:
        assert r.returncode == 0, r.stderr[-3000:]
        assert s["stopped_because"] == "max_steps" and s["steps"] == 10 and s["skipped_nonfinite_steps"] == 2
    assert all(torch.isfinite(t).all() for t in load_file(run / "model.safetensors").values())


def test_a_dead_rank_ends_the_job_instead_of_hanging(tmp_path):
    rec = recipe(tmp_path, MLP, distributed={"strategy": "ddp", "timeout_seconds": 30},
                 callbacks=[{"path": "tests.helpers.killer:KillAt", "kwargs": {"step": 5, "rank": 1}}])
    r = torchrun("fit", rec, "--run-dir", tmp_path / "run", "--quiet", timeout=120)
    assert r.returncode != 0 and "Signals.SIGKILL" in r.stderr or "SIGKILL" in r.stderr


def test_clear_errors(tmp_path):
    r = single("fit", recipe(tmp_path, MLP, distributed={"strategy": "ddp"}), "--run-dir", tmp_path / "a")
    assert r.returncode == 2 and "needs torchrun" in r.stderr and "Traceback" not in r.stderr
    r = torchrun("fit", recipe(tmp_path, MLP, distributed={"strategy": "ddp"}, data={"batch_size": 63}),
                 "--run-dir", tmp_path / "b")
    assert "data.batch_size: 63 (the global batch) is not divisible by the world size 2" in r.stderr
    r = torchrun("fit", recipe(tmp_path, MLP), "--run-dir", tmp_path / "c")
    assert "torchrun started 2 processes; set distributed.strategy=ddp or fsdp" in r.stderr


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_accumulation_skips_sync_and_matches_one_process(tmp_path, strategy):
    """accumulate=2 under 2 ranks gives the one-process result (test_grad_sync.py checks that the
    all-reduce is switched off for the non-final micro-batches)."""
    acc = {"accumulate": 2, "max_steps": 8}
    r = single("fit", recipe(tmp_path, MLP, loop=acc), "--run-dir", tmp_path / "one", "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    r = torchrun("fit", recipe(tmp_path, MLP, loop=acc, distributed={"strategy": strategy}),
                 "--run-dir", tmp_path / "two", "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    assert_close_runs(tmp_path / "two", tmp_path / "one")


def test_rank_zero_slower_than_the_collective_timeout_in_its_own_work_does_not_end_the_job(tmp_path):
    # rank 0's writes take longer than distributed.timeout_seconds: the others wait for them on the
    # barrier of rank0_timeout_seconds, not in the next collective (which would time out)
    rec = recipe(tmp_path, MLP, distributed={"strategy": "ddp", "timeout_seconds": 6},
                 loop={"max_steps": 8, "eval_every": 4, "log_every": 4}, checkpoint={"every_n_steps": 4})
    cmd = [*TORCHRUN, "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           str(ROOT / "tests" / "helpers" / "slow_rank0.py"), "8", "fit", str(rec), "--run-dir", str(tmp_path / "run"),
           "--quiet"]
    r = run_group(cmd, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step-*")) == ["step-00000004",
                                                                                        "step-00000008"]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["steps"] == 8
