"""Users' own programs, run as a user runs them: each a Python file in a folder of its own, in a
subprocess, importing ecotrain from an installed wheel (not this source tree). Killed by real
signals mid-run and restarted, nested inputs, an item of another shape, a small in-memory Dataset."""

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.helpers.user_program import final_checkpoint_differences


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """ecotrain built as a wheel and installed (without dependencies: the test environment has them)
    into a folder that comes first on the programs' path."""
    tmp = tmp_path_factory.mktemp("wheel")
    tree = tmp / "project"  # a copy: setuptools builds in the project's folder, and two workers may build at once
    shutil.copytree(ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "-w", str(tmp / "dist"), str(tree)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    wheel = next((tmp / "dist").glob("ecotrain-*.whl"))
    inst = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(tmp / "site"),
                           str(wheel)], capture_output=True, text=True, timeout=300)
    assert inst.returncode == 0, inst.stderr
    return tmp / "site"


def program(installed, folder: Path, text: str, *args, check_source=True):
    """Run `text` as the user's program.py in `folder`; returns the CompletedProcess."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "program.py").write_text(textwrap.dedent(text))
    env = {**os.environ, "PYTHONPATH": str(installed), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "program.py", *map(str, args)], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_programs_import_the_installed_wheel(installed, tmp_path):
    r = program(installed, tmp_path, "import ecotrain; print(ecotrain.__file__)")
    assert r.returncode == 0 and Path(r.stdout.strip()).is_relative_to(installed), r.stdout + r.stderr


@pytest.mark.parametrize("kind", ["shuffle2", "stateful"])  # every kind, resumed in process: test_user_resume.py
def test_killed_by_sigkill_twice_the_final_checkpoint_is_the_whole_runs(installed, tmp_path, kind):
    shutil.copy(ROOT / "tests" / "helpers" / "user_program.py", tmp_path / "user_program.py")
    text = "import sys, user_program; user_program.main(sys.argv[1:])"
    assert program(installed, tmp_path, text, kind, "whole").returncode == 0
    for k in (3, 14):  # in epoch 0, then in epoch 2
        assert program(installed, tmp_path, text, kind, "cut", "--kill-after", k).returncode == -signal.SIGKILL
    done = program(installed, tmp_path, text, kind, "cut")
    assert done.returncode == 0, done.stderr[-2000:]
    assert final_checkpoint_differences(tmp_path / "whole", tmp_path / "cut") == []


NESTED = """
    import torch
    from torch import nn
    from ecotrain import Config, fit

    class Pairs(torch.utils.data.Dataset):  # ((a, b), y) items
        def __len__(self):
            return 64
        def __getitem__(self, i):
            return (torch.full((5,), i / 64), torch.ones(2)), i % 3

    class TwoInputs(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(5, 3), nn.Linear(2, 3)
        def forward(self, x1, x2):
            return self.a(x1) + self.b(x2)

    cfg = Config.model_validate({"loop": {"max_steps": 6, "max_epochs": None}, "ledger": {"enabled": False}})
    r = fit(cfg, model=TwoInputs(), data=Pairs(), run_dir="run", quiet=True)
    print("steps", r.summary["steps"])
"""


def test_nested_inputs_reach_forward_as_its_arguments(installed, tmp_path):
    r = program(installed, tmp_path, NESTED)
    assert r.returncode == 0 and "steps 6" in r.stdout, r.stderr[-2000:]


SHAPES = """
    import sys
    import torch
    from torch import nn
    from ecotrain import Config, fit
    from ecotrain.base.errors import DataError

    class Drifting(torch.utils.data.Dataset):  # item 50 on is of another width: the up-front read sees item 0
        def __len__(self):
            return 64
        def __getitem__(self, i):
            return torch.ones(7 if i >= 50 else 5), i % 3

    cfg = Config.model_validate({"loop": {"max_steps": 12, "max_epochs": None}, "data": {"batch_size": 8},
                                 "ledger": {"enabled": False}, "checkpoint": {"every_n_steps": 1}})
    try:
        fit(cfg, model=nn.Linear(5, 3), data=Drifting(), run_dir="run", quiet=True)
    except DataError as e:
        print("DataError", e)
        sys.exit(e.exit_code)
"""


def test_an_item_of_another_shape_is_named_with_its_shapes_and_the_checkpoint_kept(installed, tmp_path):
    r = program(installed, tmp_path, SHAPES)
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("DataError")]
    assert r.returncode == 2 and len(line) == 1, r.stdout + r.stderr[-2000:]
    assert "float32[7]" in line[0] and "item 0 holds" in line[0] and "float32[5]" in line[0]
    assert any((tmp_path / "run" / "checkpoints").glob("step-*"))  # the steps before it are kept


CHEAP = """
    import torch
    from torch import nn
    from ecotrain import Config, fit
    from ecotrain.data import loader

    loader.WINDOW_BATCHES = 4  # judge the share early, as a long run would
    ds = torch.utils.data.TensorDataset(torch.randn(2048, 4), torch.randint(0, 2, (2048,)))
    cfg = Config.model_validate({"loop": {"max_steps": 60, "max_epochs": None}, "data": {"batch_size": 8},
                                 "ledger": {"enabled": False}})
    r = fit(cfg, model=nn.Linear(4, 2), data=ds, run_dir="run", quiet=True)
    print("share", r.summary["data_wait_share"])
"""


def test_a_small_in_memory_dataset_trains_in_a_users_program(installed, tmp_path):
    # Whether it gets the "raise data.workers" hint is timed, and so depends on the machine's load: the
    # decision is tested on its figures (tests/unit/test_loader.py), the timing in bench/input_bound.py
    r = program(installed, tmp_path, CHEAP)
    assert r.returncode == 0, r.stderr[-2000:]
    assert 0 <= float(r.stdout.split("share")[1]) <= 1
