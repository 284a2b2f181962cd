"""ZeRO-2 under real torchrun (gloo, 2 CPU ranks): `distributed.strategy=zero2` is FSDP2 with the
parameters kept gathered from forward to backward; it trains as one process does, writes sharded
checkpoints, resumes bit for bit at 2 ranks and reshards to 1 process; and it shards the gradients
and optimizer state (each rank holds about half)."""

import json
import shutil

from tests.distributed.test_torchrun import MLP, assert_close_runs, recipe, single, torchrun


def test_zero2_trains_checkpoints_resumes_and_reshards(tmp_path):
    base = tmp_path / "single"
    r = single("fit", recipe(tmp_path, MLP), "--run-dir", base, "--quiet")
    assert r.returncode == 0, r.stderr
    rec = recipe(tmp_path, MLP, distributed={"strategy": "zero2"}, checkpoint={"every_n_steps": 8})
    run = tmp_path / "run"
    r = torchrun("fit", rec, "--run-dir", run, "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    assert_close_runs(run, base)
    saved = (run / "config.yaml").read_text()
    assert "strategy: fsdp" in saved and "reshard_after_forward: false" in saved  # zero2 as the FSDP config it is
    shards = sorted(p.name for p in (run / "checkpoints" / "step-00000008" / "shards").iterdir())
    assert len(shards) == 2  # gradients' and optimizer state's owners: one shard file per rank
    final = (run / "model.safetensors").read_bytes()
    shutil.rmtree(run / "checkpoints" / "step-00000016")
    (run / "model.safetensors").unlink()
    r = torchrun("fit", rec, "--run-dir", run, "--resume", "auto", "--quiet")
    assert r.returncode == 0 and "step-00000008" in r.stderr, r.stderr[-3000:]
    assert (run / "model.safetensors").read_bytes() == final  # bit-identical resume at 2 ranks
    one = tmp_path / "one"
    (one / "checkpoints").mkdir(parents=True)
    shutil.copytree(run / "checkpoints" / "step-00000008", one / "checkpoints" / "step-00000008")
    r = single("fit", recipe(tmp_path, MLP), "--run-dir", one, "--resume", "auto", "--allow-config-change", "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    assert_close_runs(one, base, after=8)  # 2 ranks -> 1 process: DCP reshards
    assert json.loads((one / "summary.json").read_text())["world_size"] == 1
