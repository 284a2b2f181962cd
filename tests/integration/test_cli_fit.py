"""The real CLI on tiny data: run folder contents, accuracy, errors."""

import json

import yaml


def test_fit_writes_a_complete_run_folder(cli, tmp_path):
    run = tmp_path / "run"
    r = cli("fit", "recipes/mnist1d_cnn.yaml", "loop.max_steps=300", "loop.eval_every=100", "--run-dir", run, "--quiet")
    assert r.returncode == 0, r.stderr
    assert "test_accuracy:" in r.stdout and str(run) in r.stdout
    s = json.loads((run / "summary.json").read_text())
    for key in ("test_accuracy", "best_val_metric", "steps", "epochs", "train_seconds", "stopped_because",
                "dataset_hash", "versions", "train_val_gap"):
        assert key in s, key
    assert s["steps"] == 300 and s["stopped_because"] == "max_steps"
    assert s["test_accuracy"] > 0.5  # 300 steps of the CNN: well above chance (0.1)
    assert set(s["versions"]) == {"python", "torch", "ecotrain"}
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["loop"]["max_steps"] == 300 and cfg["name"] == "mnist1d_cnn"
    lines = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    assert [l["step"] for l in lines if "loss" in l and "val_loss" not in l][:3] == [100, 200, 300]
    assert lines[-1]["step"] == 300 and "val_accuracy" in lines[-1]
    assert (run / "model.safetensors").stat().st_size > 10_000


def test_digits_resnet_epochs_and_python_m(cli, tmp_path):
    r = cli("fit", "recipes/digits_resnet.yaml", "loop.max_epochs=3", "--run-dir", tmp_path, "--quiet")
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["stopped_because"] == "max_epochs" and s["epochs"] == 3 and s["test_accuracy"] > 0.8


def test_bad_data_path_is_one_clear_line(cli, tmp_path):
    r = cli("fit", "recipes/mnist1d_cnn.yaml", "data.name=npz", f"data.path={tmp_path}/missing.npz", "--run-dir", tmp_path / "r")
    assert r.returncode == 2 and "data.path" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "r").exists()  # nothing half-written


def test_unknown_key_exit_2(cli):
    r = cli("fit", "recipes/mnist1d_cnn.yaml", "loop.max_stepz=3")
    assert r.returncode == 2 and "'loop.max_stepz': unknown key" in r.stderr


def test_impossible_model_kwargs_and_missing_checkpoint_are_one_line(cli, tmp_path):
    r = cli("plan", "recipes/charlm_long.yaml", "model.kwargs.n_heads=7")
    assert r.returncode == 2 and "model.kwargs: d_model=256 is not a multiple of n_heads=7" in r.stderr
    assert "Traceback" not in r.stderr
    r = cli("fit", "recipes/digits_resnet.yaml", "--resume", tmp_path / "nope", "--run-dir", tmp_path / "r", "--quiet")
    assert r.returncode == 3 and "no such checkpoint folder" in r.stderr and "Traceback" not in r.stderr
