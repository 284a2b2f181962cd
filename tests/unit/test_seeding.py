"""seeding.py: seeds, and deterministic-algorithm flags that are restored on exit."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import numpy as np
import pytest
import torch

from ecotrain.core.seeding import deterministic_algorithms, seed_everything


def flags():
    return (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
            torch.backends.cudnn.benchmark, os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
            torch.utils.deterministic.fill_uninitialized_memory)


@pytest.fixture
def clean_flags(monkeypatch):
    before = flags()
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.benchmark = False
    torch.utils.deterministic.fill_uninitialized_memory = True  # torch's default
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    torch.backends.cudnn.benchmark = before[2]
    torch.utils.deterministic.fill_uninitialized_memory = before[4]


def test_seed_everything_repeats_every_generator():
    def draw():
        return random.random(), np.random.rand(), torch.rand(1).item()

    seed_everything(123)
    a = draw()
    seed_everything(123)
    assert draw() == a
    seed_everything(2**40 + 5)  # larger than NumPy's 32-bit seeds: reduced, not rejected
    seed_everything(124)
    assert draw() != a


def test_flags_set_inside_and_restored_after(clean_flags):
    torch.backends.cudnn.benchmark = True
    with deterministic_algorithms(True):  # strict: an op with no deterministic kernel raises (issue 32)
        assert flags() == (True, False, False, ":4096:8", False)  # no NaN fill of new tensors (seeding.py)
    assert flags() == (False, False, True, None, True), "the env var must be removed again: it was not set before"


def test_restored_after_an_exception(clean_flags):
    with pytest.raises(RuntimeError, match="boom"):
        with deterministic_algorithms(True):
            raise RuntimeError("boom")
    assert flags() == (False, False, False, None, True)


def test_previous_values_are_kept(clean_flags, monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    torch.use_deterministic_algorithms(True, warn_only=True)  # a user's own lenient setting before
    with deterministic_algorithms(True):
        assert flags() == (True, False, False, ":16:8", False)  # strict inside; the env var not overwritten
    assert flags() == (True, True, False, ":16:8", True)  # and the user's setting back after


def test_disabled_changes_nothing(clean_flags):
    torch.backends.cudnn.benchmark = True
    with deterministic_algorithms(False):
        assert flags() == (False, False, True, None, True)
    assert flags() == (False, False, True, None, True)


def test_inductor_flag_follows_when_inductor_is_loaded(clean_flags):
    import torch._inductor.config as inductor_config

    before = inductor_config.deterministic
    with deterministic_algorithms(True):
        assert inductor_config.deterministic is True
    assert inductor_config.deterministic == before


def test_does_not_import_dynamo():
    code = ("import sys, torch; from ecotrain.core.seeding import deterministic_algorithms, seed_everything\n"
            "with deterministic_algorithms(True):\n"
            "    seed_everything(0); assert torch.are_deterministic_algorithms_enabled()\n"
            "assert 'torch._dynamo' not in sys.modules and 'torch._inductor' not in sys.modules")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr


def test_deterministic_warns_when_cuda_ran_before_cublas_workspace_was_set(monkeypatch, caplog):
    # torch reads CUBLAS_WORKSPACE_CONFIG once, at its first cuBLAS handle: set at fit() after CUDA work
    # (an API user's earlier matmul) it may come too late; a CUDA-only condition, so its one seam is patched
    import logging

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with caplog.at_level(logging.WARNING, logger="ecotrain"), deterministic_algorithms(True):
        pass
    assert any("CUBLAS_WORKSPACE_CONFIG=:4096:8 before any CUDA work" in r.getMessage() for r in caplog.records)
    caplog.clear()
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # set by the user: nothing to say
    with caplog.at_level(logging.WARNING, logger="ecotrain"), deterministic_algorithms(True):
        pass
    assert not [r for r in caplog.records if "CUBLAS" in r.getMessage()]
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)  # no CUDA work yet: set in time
    with caplog.at_level(logging.WARNING, logger="ecotrain"), deterministic_algorithms(True):
        pass
    assert not [r for r in caplog.records if "CUBLAS" in r.getMessage()]
