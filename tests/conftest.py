import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

# in-process fit() sizes torch's threads from the machine (threads.py) unless the user set this; tests run
# tiny models on 2-core CI, where threads only add contention (tests of the auto choice remove it)
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
torch.set_num_threads(1)  # 2-core CI: tests run tiny models; threads only add contention


SPAWNS = ("subprocess", "run_cli", "cli(", "sys.executable", "torchrun(", "single(")


def pytest_collection_modifyitems(items):
    """Tiers as markers: `unit` (in-process, tests/unit), `subprocess` (a test in tests/unit that
    starts a real process), `integration`, `distributed`, `hostile` (their folders). `make test` runs
    them all; `pytest -m unit` is the fast tier."""
    for item in items:
        tier = Path(str(item.fspath)).parent.name
        if tier == "unit":
            fn = getattr(item, "function", None)
            src = inspect.getsource(fn) if fn is not None else ""
            if "cli" in item.fixturenames or any(w in src for w in SPAWNS):
                tier = "subprocess"
        item.add_marker(getattr(pytest.mark, tier))


def run_cli(*args, cwd=None, timeout=300, env=None):
    """Run the real `python -m ecotrain ...` in a subprocess."""
    e = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "ecotrain", *map(str, args)], cwd=cwd or ROOT,
                          capture_output=True, text=True, timeout=timeout, env=e)


@pytest.fixture(autouse=True, scope="session")
def _dataset_cache(tmp_path_factory):
    """Generated datasets (data/cache.py) are cached in this session's own folder, never the user's;
    subprocesses (run_cli) inherit it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ECOTRAIN_CACHE", str(tmp_path_factory.mktemp("dataset-cache")))
        yield


@pytest.fixture
def ecotrain_log(caplog):
    """The `ecotrain` logger's messages (warnings, notes) as text, whatever handlers exist."""
    import logging

    logger = logging.getLogger("ecotrain")
    logger.addHandler(caplog.handler)
    yield caplog
    logger.removeHandler(caplog.handler)


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def tiny_cfg():
    from ecotrain import Config

    def make(**over):
        tree = {"data": {"name": "digits", "batch_size": 32, "val_split": 0.15},
                "model": {"name": "mlp", "kwargs": {"hidden": [32]}},
                "optim": {"lr": 3e-3}, "loop": {"max_steps": 60, "max_epochs": None, "log_every": 10, "eval_every": 20},
                "logging": {"progress": "off"}}
        for k, v in over.items():
            node = tree
            *path, last = k.split(".")
            for p in path:
                node = node.setdefault(p, {})
            node[last] = v
        return Config.model_validate(tree)
    return make
