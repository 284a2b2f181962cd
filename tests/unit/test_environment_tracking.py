"""environment.py (git commit and dirty flag, missing or slow git, packages, hardware), progress_work.py,
the tracking section of the config, a tracker chosen but not installed, and the report's generic
method sections."""

import os
import subprocess
import sys
import time

import pytest

from ecotrain.base import environment
from ecotrain.config import load_config
from ecotrain.base.errors import ConfigError


def _git(repo, *args):
    subprocess.run(["git", "-c", "user.email=t@example.org", "-c", "user.name=t", *args], cwd=repo, check=True,
                   capture_output=True)


def test_git_commit_and_dirty_flag(tmp_path):
    repo = tmp_path / "code"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "train.py").write_text("print(1)\n")
    _git(repo, "add", "train.py")
    _git(repo, "commit", "-q", "-m", "first")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    info = environment.git_info(repo)
    assert info["commit"] == head and info["dirty"] is False and info["root"] == str(repo.resolve())
    (repo / "runs").mkdir()
    (repo / "runs" / "new.txt").write_text("untracked: a run folder does not make the code dirty")
    assert environment.git_info(repo)["dirty"] is False
    (repo / "train.py").write_text("print(2)\n")
    assert environment.git_info(repo)["dirty"] is True


def test_no_repository_no_git_or_a_hanging_git_leave_git_out(tmp_path, monkeypatch):
    outside = tmp_path / "plain"
    outside.mkdir()
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    assert environment.git_info(outside) is None
    assert "git" not in environment.capture(cwd=outside)
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "git").write_text(f"#!{sys.executable}\nimport time\ntime.sleep(5)\n")
    (fake / "git").chmod(0o755)
    monkeypatch.setattr(environment, "GIT_TIMEOUT", 0.2)
    monkeypatch.setenv("PATH", str(fake))
    t0 = time.perf_counter()
    assert environment.git_info(outside) is None  # timed out
    assert time.perf_counter() - t0 < 3
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    assert environment.git_info(outside) is None  # no git at all


def test_capture_packages_hardware_dataset():
    import torch  # noqa: F401  (the run has imported it; capture reads torch's threads and GPUs)

    env = environment.capture(dataset_hash="sha256:abc")
    assert env["dataset_hash"] == "sha256:abc"
    assert env["packages"]["torch"].startswith("2.") and "ecotrain" in env["packages"]
    hw = env["hardware"]
    assert hw["cpu_count"] >= 1 and hw["torch_threads"] >= 1 and isinstance(hw["gpus"], list)
    assert env["python"]["version"].count(".") == 2


def test_progress_work_is_silent_without_a_terminal(capsys):
    from ecotrain.base.progress_work import work

    with work("generating", total=3) as advance:
        for _ in range(3):
            advance()
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""


def test_tracking_config_on_off_and_unknown():
    cfg = load_config(None, ["tracking.tensorboard=true", "tracking.mlflow={experiment: x}"])
    assert cfg.tracking.tensorboard.log_dir is None and cfg.tracking.mlflow.experiment == "x"
    assert load_config(None, ["tracking.mlflow=false"]).tracking.mlflow is None
    with pytest.raises(ConfigError, match="tracking.wandb': unknown key"):
        load_config(None, ["tracking.wandb=true"])


def _ctx(cfg, path, is_main=True):
    """What the tracking wing is given (callbacks/wing.py); the state and checkpointer it does not read."""
    from ecotrain.callbacks.wing import WingContext

    return WingContext(cfg, state=None, run_dir=path, is_main=is_main, eval_samples=0, checkpointer=None)


@pytest.mark.parametrize("name", ["mlflow", "tensorboard"])
def test_a_tracker_chosen_but_not_installed_is_one_line(name, monkeypatch, tmp_path):
    import importlib.util

    from ecotrain import tracking

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda mod, *a: None if mod == name else real(mod, *a))
    cfg = load_config(None, [f"tracking.{name}=true"])
    with pytest.raises(ConfigError) as err:
        tracking.run_callbacks(_ctx(cfg, tmp_path))
    msg = str(err.value)
    assert "\n" not in msg and f"pip install 'ecotrain[{name}]'" in msg and msg.startswith(f"tracking.{name}: ")
    assert tracking.run_callbacks(_ctx(cfg, tmp_path, is_main=False)) == []  # other ranks: nothing
    assert tracking.run_callbacks(_ctx(load_config(None, []), tmp_path)) == []


def test_plain_runs_and_the_report_module_import_no_tracker():
    code = ("import sys, ecotrain.assembly.trainer, ecotrain.tracking, ecotrain.report, ecotrain.base.environment; "
            "bad = [m for m in ('mlflow', 'tensorboard', 'torch.utils.tensorboard', 'matplotlib', 'selenium') "
            "if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stdout + r.stderr


def test_methods_sections_are_rendered_generically(tmp_path):
    from ecotrain.report.page import method_sections
    from ecotrain.report.rundata import RunData

    run = RunData(path=tmp_path, name="r", summary={"methods": {
        "batchnorm": {"title": "BatchNorm report", "text": "eval vs train mode", "gap": 0.031, "policy": "recompute",
                      "layers": {"bn1": {"drift": 0.2}}, "drift_by_epoch": [0.3, 0.2, 0.1],
                      "sparsity": [[0, 0.0], [100, 0.5]], "names": ["a", "b"]},
        "ema": {"decay": 0.999, "updates": 60}}})
    html = method_sections(run)
    assert '<h2>BatchNorm report</h2>' in html and "<p>eval vs train mode</p>" in html
    assert "layers.bn1.drift" in html and "recompute" in html and '["a", "b"]' in html.replace("&quot;", '"')
    assert html.count("<img ") == 2 and html.count('src="data:image/png;base64,') == 2
    assert "<h2>Method: ema</h2>" in html and "0.999" in html
