import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
torch.set_num_threads(1)  # 2-core CI: tests run tiny models; threads only add contention


def run_cli(*args, cwd=None, timeout=300, env=None):
    """Run the real `python -m ecotrain ...` in a subprocess."""
    e = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "ecotrain", *map(str, args)], cwd=cwd or ROOT,
                          capture_output=True, text=True, timeout=timeout, env=e)


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
