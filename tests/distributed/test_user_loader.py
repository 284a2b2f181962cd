"""A user's own DataLoader under real torchrun: with a DistributedSampler it trains each rank on its
share and a SIGKILLed run resumes exactly; without one it is refused in one line with the fix."""

import subprocess
import sys

import pytest

from tests.distributed.test_torchrun import ENV, ROOT, free_port, run_group
from tests.helpers.user_program import final_checkpoint_differences

PROGRAM = ROOT / "tests" / "helpers" / "user_program.py"


def program(kind, run_dir, *extra, nproc=2):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-addr",
           "127.0.0.1", "--master-port", str(free_port()), str(PROGRAM), kind, str(run_dir), *extra]
    return run_group(cmd, 240, env={**ENV, "PYTHONPATH": str(ROOT)})


@pytest.mark.parametrize("kind", ["distributed", "hf_stream"])
def test_a_loader_sharded_per_rank_resumes_exactly_after_sigkill(tmp_path, kind):
    """A DistributedSampler, or a `datasets` stream that ecotrain splits per rank (each rank's own
    position in the checkpoint)."""
    ref, run = tmp_path / "ref", tmp_path / "run"
    r = program(kind, ref)
    assert r.returncode == 0, r.stderr[-3000:]
    assert program(kind, run, "--kill-after", "14").returncode != 0  # epoch 2 of 6 steps each
    if kind == "hf_stream":  # each rank's position: it cannot be resharded, said in one line, nothing written
        before = sorted(p.name for p in (run / "checkpoints").iterdir())
        r = program(kind, run, nproc=1)
        said = [ln for ln in r.stderr.splitlines() if "CheckpointError: data: the loader's own position" in ln]
        assert r.returncode != 0 and said and "resume with 2" in said[0], r.stderr[-2000:]
        assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before
    r = program(kind, run)
    assert r.returncode == 0, r.stderr[-3000:]
    assert final_checkpoint_differences(run, ref) == []


def test_a_loader_without_a_distributed_sampler_is_refused_in_one_line(tmp_path):
    r = program("shuffle0", tmp_path / "run")
    assert r.returncode != 0
    # the program's uncaught exception: its message is the one line, with the fix
    said = [ln for ln in r.stderr.splitlines() if "ConfigError: data: under torchrun (2 ranks) every rank" in ln]
    assert said and "DistributedSampler(dataset, num_replicas=" in said[0], r.stderr[-2000:]
    assert not (tmp_path / "run" / "checkpoints").exists()  # refused before anything trained
    assert not subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True).stdout  # no rank left
