"""Faults a cluster inflicts, with real torchrun and gloo on CPU: a worker SIGKILLed under torchrun's
elastic agent (the group restarts and resumes exactly), and a run whose world size changes between
segments (2 -> 1 -> 2 ranks, one global batch, more micro-batches on fewer ranks)."""

import json
import os

from safetensors.torch import load_file

from tests.distributed.test_torchrun import ENV, MLP, TORCHRUN, free_port, lines, recipe, run_group, torchrun

ELASTIC = ["--nnodes", "1:2", "--max-restarts", "2", "--rdzv-backend", "c10d", "--rdzv-conf", "last_call_timeout=1",
           "--monitor-interval", "0.5"]


def test_a_killed_worker_is_restarted_by_torchrun_and_the_run_resumes_exactly(tmp_path):
    base = {"distributed": {"strategy": "ddp"}, "checkpoint": {"every_n_steps": 4}, "loop": {"log_every": 1}}
    ref = tmp_path / "ref"
    r = torchrun("fit", recipe(tmp_path, MLP, **base), "--run-dir", ref, "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    kill = {"path": "tests.helpers.killer:KillAt", "kwargs": {"step": 11, "rank": 1, "attempt": 0}}
    run = tmp_path / "run"
    cmd = [*TORCHRUN, *ELASTIC, "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--nproc-per-node", "2",
           "-m", "ecotrain", "fit", str(recipe(tmp_path, MLP, **base, callbacks=[kill])), "--run-dir", str(run),
           "--resume", "auto", "--quiet"]
    r = run_group(cmd, 240)
    assert r.returncode == 0, r.stderr[-3000:]  # torchrun restarted the group once, and it finished
    assert "resuming from" in r.stderr and "step-00000008" in r.stderr  # after torchrun restarted the group
    assert (run / "model.safetensors").read_bytes() == (ref / "model.safetensors").read_bytes()
    assert lines(run) == lines(ref)  # every step once in metrics.jsonl: none twice, none skipped
    s = json.loads((run / "summary.json").read_text())
    assert s["resumes"] == 1 and s["steps_redone"] == 3  # steps 9-11 were trained before the kill, and again


def test_a_run_resized_from_2_to_1_to_2_ranks_follows_the_uninterrupted_one(tmp_path):
    """One global batch of 64 at every world size; loop.micro_batch_size 16 cuts each rank's share
    into 2 micro-batches on 2 ranks, 4 on 1. The sampler's batches do not depend on the world size."""
    from ecotrain.core.distributed import AGREE_MAX_STEPS

    loop = {"max_steps": 2 * AGREE_MAX_STEPS + 40, "log_every": 10, "eval_every": 1000}
    ref = tmp_path / "ref"
    r = torchrun("fit", recipe(tmp_path, MLP, loop=loop, distributed={"strategy": "ddp"}), "--run-dir", ref, "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    rec = recipe(tmp_path, MLP, loop={**loop, "micro_batch_size": 16}, distributed={"strategy": "ddp"},
                 checkpoint={"every_n_steps": 1000}, callbacks=[{"path": "tests.helpers.killer:SigtermAtEnvStep"}])
    run, stops = tmp_path / "run", []
    for nproc, stop in ((2, 5), (1, None), (2, "never")):
        if stop is None:  # one rank agrees at every step: it stops exactly where told
            stop = stops[-1] + 30
        env = {**ENV, "ECOTRAIN_TEST_SIGTERM_AT": str(stop)}
        cmd = [*TORCHRUN, "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1", "--master-port",
               str(free_port()), "-m", "ecotrain", "fit", str(rec), "--run-dir", str(run), "--resume", "auto", "--quiet"]
        r = run_group(cmd, 240, env=env)
        if stop != "never":
            assert r.returncode != 0 and "exitcode  : 75" in r.stderr, r.stderr[-3000:]  # preempted: checkpointed
            stops.append(max(int(p.name.split("-")[1]) for p in (run / "checkpoints").iterdir()))
    assert r.returncode == 0, r.stderr[-3000:]
    assert 5 <= stops[0] < stops[1] == stops[0] + 30 < loop["max_steps"], stops
    wa, wb = load_file(run / "model.safetensors"), load_file(ref / "model.safetensors")
    diff = max((wa[k] - wb[k]).abs().max().item() for k in wa)
    assert diff <= 1e-5, diff  # the same sums in another order
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (run, ref))
    assert sa["test_accuracy"] == sb["test_accuracy"] and sa["world_size"] == 2 and sa["micro_batches"] == 2
    assert sa["resumes"] == 2
    assert os.environ.get("ECOTRAIN_TEST_SIGTERM_AT") is None  # the stop step reached the runs via their env only


def test_fsdp_background_saves_are_complete_checkpoints_and_a_sigterm_waits_for_them(tmp_path):
    """checkpoint.background under FSDP: DCP's async_save writes the shards while training goes on;
    a SIGTERM's checkpoint is complete before exit 75, and resuming from it ends where the
    uninterrupted run ends, bit for bit."""
    from ecotrain.core.distributed import AGREE_MAX_STEPS

    loop = {"max_steps": AGREE_MAX_STEPS + 30, "log_every": 10, "eval_every": 1000}
    kw = {"loop": loop, "distributed": {"strategy": "fsdp"}, "checkpoint": {"every_n_steps": 7, "background": True}}
    ref = tmp_path / "ref"
    r = torchrun("fit", recipe(tmp_path, MLP, **kw), "--run-dir", ref, "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    assert all((p / "MANIFEST.json").is_file() and len(list((p / "shards").iterdir())) >= 2
               for p in (ref / "checkpoints").iterdir())
    rec = recipe(tmp_path, MLP, **kw, callbacks=[{"path": "tests.helpers.killer:SigtermAtEnvStep"}])
    run = tmp_path / "run"
    cmd = [*TORCHRUN, "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           "-m", "ecotrain", "fit", str(rec), "--run-dir", str(run), "--quiet"]
    r = run_group(cmd, 240, env={**ENV, "ECOTRAIN_TEST_SIGTERM_AT": "3"})
    assert r.returncode != 0 and "exitcode  : 75" in r.stderr, r.stderr[-3000:]
    assert "s after the notice" in r.stdout and "preemption: checkpoint" in r.stderr
    assert not list((run / "checkpoints").glob(".tmp-*"))  # the last save finished before the exit
    r = torchrun("fit", rec, "--run-dir", run, "--resume", "auto", "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    assert (run / "model.safetensors").read_bytes() == (ref / "model.safetensors").read_bytes()
    s = json.loads((run / "summary.json").read_text())
    assert s["resumes"] == 1 and s["checkpoint_blocked_seconds"] > 0


def test_an_oom_on_one_rank_restarts_every_rank_with_twice_the_micro_batches(tmp_path):
    """Under torchrun a rank cannot retry a step alone (the others are inside its collectives): it
    writes the doubled count to the run folder and stops; torchrun restarts the group and every rank
    resumes from the checkpoint with that count. The maths is the same: the run ends where one with
    2 micro-batches from the start ends (up to summation order). And the failing rank exits at once:
    it used to wait in a barrier while its peer waited in the step's all-reduce, until the timeout."""
    base = {"distributed": {"strategy": "ddp"}, "checkpoint": {"every_n_steps": 4}}
    ref = tmp_path / "ref"
    model = {"name": "tests.helpers.poison:OomOnRank", "kwargs": {"at": 6, "rank": 1, "fits": 16}}
    r = torchrun("fit", recipe(tmp_path, MLP, **base, model=model, loop={"micro_batch_size": 16}), "--run-dir", ref,
                 "--quiet")  # 2 micro-batches of 16 per rank from the start: never out of memory
    assert r.returncode == 0, r.stderr[-3000:]
    run = tmp_path / "run"
    cmd = [*TORCHRUN, *ELASTIC, "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--nproc-per-node", "2",
           "-m", "ecotrain", "fit", str(recipe(tmp_path, MLP, **base, model=model)), "--run-dir", str(run),
           "--resume", "auto", "--quiet"]
    r = run_group(cmd, 240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "rank 1: out of memory at step 6; every rank continues with 2 micro-batches (was 1)" in r.stderr
    assert "every rank continues with 2 micro-batches" in r.stderr and "step-00000004" in r.stderr
    s = json.loads((run / "summary.json").read_text())
    assert s["micro_batches"] == 2 and s["oom_recoveries"] == 1 and s["resumes"] == 1
    wa, wb = load_file(run / "model.safetensors"), load_file(ref / "model.safetensors")
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) <= 1e-5
