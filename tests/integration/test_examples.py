"""The user examples (examples/), run as a user runs them; the two with a checkpointed position
killed with a real SIGKILL mid-epoch and resumed: the final weights are bit-identical to a run that
was never killed."""

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors import safe_open

from conftest import ROOT


def run_example(script, *args, timeout=300):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / script), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def figure(out: str, key: str) -> str:
    return out.split(f"{key}=")[1].split()[0]


def final_weights(run_dir):
    newest = sorted((run_dir / "checkpoints").glob("step-*"))[-1]
    with safe_open(str(newest / "tensors.safetensors"), "pt") as f:
        return newest.name, {k: f.get_tensor(k) for k in f.keys() if k.startswith("model/")}


def kill_then_resume(script, run_dir, args, after_step):
    """Start the example, SIGKILL it once its step-`after_step` checkpoint is complete (it trains on past
    it: the kill lands at a step the test does not choose), then run it again with --resume."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, str(ROOT / "examples" / script), *args, "--run-dir", str(run_dir)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=ROOT)
    marker = run_dir / "checkpoints" / f"step-{after_step:08d}" / "MANIFEST.json"
    deadline = time.monotonic() + 240
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    assert not (run_dir / "summary.json").exists()  # killed before the end
    return run_example(script, *args, "--run-dir", run_dir, "--resume")


@pytest.mark.parametrize("script,args,after", [
    ("hf_text_classification.py", ["--steps", "40", "--checkpoint-every", "5", "--samples", "400"], 10),
    ("stream.py", ["--steps", "50", "--checkpoint-every", "5", "--per-pass", "500"], 10),
])
def test_killed_mid_epoch_and_resumed_is_bit_identical(tmp_path, script, args, after):
    whole = run_example(script, *args, "--run-dir", tmp_path / "whole")
    resumed = kill_then_resume(script, tmp_path / "killed", args, after)
    name_a, a = final_weights(tmp_path / "whole")
    name_b, b = final_weights(tmp_path / "killed")
    assert name_a == name_b and a.keys() == b.keys() and len(a) > 2
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert figure(whole, "val_accuracy") == figure(resumed, "val_accuracy")


def test_hf_example_trains_dict_batches_with_the_models_own_loss(tmp_path):
    out = run_example("hf_text_classification.py", "--steps", "60", "--samples", "600", "--run-dir", tmp_path / "r")
    assert figure(out, "task") == "model_loss"
    assert float(figure(out, "val_accuracy")) >= 0.8  # chance is 0.5


def test_regression_example_reaches_r2(tmp_path):
    out = run_example("tabular_regression.py", "--csv", tmp_path / "h.csv", "--run-dir", tmp_path / "r",
                      "--rows", "2000", "--epochs", "15")
    assert figure(out, "task") == "regression"
    assert float(figure(out, "test_r2")) >= 0.9


def test_npy_folder_example_reads_files_lazily(tmp_path):
    out = run_example("npy_folder.py", "--folder", tmp_path / "f", "--run-dir", tmp_path / "r", "--files", "500",
                      "--epochs", "6")
    assert float(figure(out, "test_accuracy")) >= 0.6  # four classes: chance is 0.25
    files, reads = int(figure(out, "files")), int(figure(out, "train_reads"))
    # 6 epochs of training reads, the final train-split metrics, the task's first item and 16 sampled
    assert reads == 6 * files + files + 1 + 16


def test_tar_shards_example_writes_and_trains_on_its_shards(tmp_path):
    out = run_example("tar_shards.py", "--shards", tmp_path / "s", "--run-dir", tmp_path / "r", "--count", "40",
                      "--per-shard", "20", "--steps", "120")
    assert len(list((tmp_path / "s").glob("train-*.tar"))) == 40
    assert float(figure(out, "test_accuracy")) >= 0.8  # four classes: chance is 0.25
