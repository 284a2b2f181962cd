"""ecotrain.core.device: `device: auto | cpu | cuda` made a torch.device, shared without importing the trainer."""

import subprocess
import sys

import pytest
import torch

from ecotrain.core.device import resolve_device
from ecotrain.base.errors import ConfigError


def test_resolve_device():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA device is available; use device=auto or cpu"):
            resolve_device("cuda")


def test_inference_and_lr_find_do_not_import_the_trainer():
    """The circle trainer -> assemble -> methods -> distill/curriculum -> inference -> trainer is gone."""
    code = ("import sys, ecotrain.export.inference, ecotrain.assembly.lrfind, ecotrain.core.device\n"
            "assert ecotrain.export.inference.resolve_device is ecotrain.core.device.resolve_device\n"
            "assert 'ecotrain.assembly.trainer' not in sys.modules, 'ecotrain.assembly.trainer imported'")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
