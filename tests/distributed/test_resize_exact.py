"""A run resized 2 -> 1 -> 2 ranks mid-epoch continues the 2-rank run exactly, wherever the stops land.

One rank of a DDP run sums its micro-batch gradients as two ranks do (loop.HalfSums): a stop that put
an update on the other side of a ReLU's kink made the resized run end 0.19 away from the
uninterrupted one (bench/elastic.py), at one stop position and not at another."""

import json
import shutil

from safetensors.torch import load_file

from tests.distributed.test_torchrun import ENV, MLP, TORCHRUN, free_port, recipe, run_group


def segment(rec, run, nproc, stop="never"):
    cmd = [*TORCHRUN, "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           "-m", "ecotrain", "fit", str(rec), "--run-dir", str(run), "--resume", "auto", "--quiet"]
    return run_group(cmd, 240, env={**ENV, "ECOTRAIN_TEST_SIGTERM_AT": str(stop)})


def test_a_resize_stopped_mid_epoch_continues_the_run_bit_for_bit(tmp_path):
    # global batch 64 in micro-batches of 16: 2 per rank on 2 ranks, 4 on 1; a checkpoint at every step
    rec = recipe(tmp_path, MLP, loop={"max_steps": 70, "log_every": 1, "eval_every": 1000, "micro_batch_size": 16},
                 distributed={"strategy": "ddp"}, checkpoint={"every_n_steps": 1, "keep_last": 100},
                 callbacks=[{"path": "tests.helpers.killer:SigtermAtEnvStep"}])
    run = tmp_path / "run"
    r = segment(rec, run, 2)  # the uninterrupted 2-rank run
    assert r.returncode == 0, r.stderr[-3000:]
    whole = load_file(run / "model.safetensors")
    whole_acc = json.loads((run / "summary.json").read_text())["test_accuracy"]
    per_epoch = min(e["step"] for e in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
                    if e.get("epoch") == 1) - 1
    first, second = 28, 61  # on 2 ranks to mid-epoch 1, on 1 rank across two epoch ends to mid-epoch 3
    assert first % per_epoch and second % per_epoch and second // per_epoch - first // per_epoch == 2, per_epoch
    for ckpt in (run / "checkpoints").iterdir():  # the 2-rank segment stopped at `first`
        if int(ckpt.name.split("-")[1]) > first:
            shutil.rmtree(ckpt)
    r = segment(rec, run, 1, second)
    assert r.returncode != 0 and f"step-{first:08d}" in r.stderr, r.stderr[-3000:]  # preempted where told
    assert max(int(p.name.split("-")[1]) for p in (run / "checkpoints").iterdir()) == second
    r = segment(rec, run, 2)
    assert r.returncode == 0 and f"step-{second:08d}" in r.stderr, r.stderr[-3000:]
    resized = load_file(run / "model.safetensors")
    diff = max((resized[k] - whole[k]).abs().max().item() for k in whole)
    assert diff <= 1e-5, diff  # the promise (docs/distributed.md) ...
    assert all((resized[k] == whole[k]).all() for k in whole)  # ... and in fact the same bits
    s = json.loads((run / "summary.json").read_text())
    assert s["test_accuracy"] == whole_acc and s["world_size"] == 2 and s["resumes"] == 2
