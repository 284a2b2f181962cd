"""Start-up: the command line starts without torch (lazy `ecotrain` package, PEP 562)."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch", "numpy", "pydantic", "rich", "yaml", "codecarbon", "mnist1d")


def test_importing_the_cli_imports_nothing_heavy():
    code = ("import sys, ecotrain.cli\n"
            f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
            "assert not heavy, heavy")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_the_training_path_imports_no_sympy():
    # sympy (~0.4 s) is for reading .pt2 shape expressions (safeload.py) only: a fit's start-up must not pay it
    code = ("import sys, ecotrain.assembly.trainer, ecotrain.assembly.entry, ecotrain.checkpoint, ecotrain.cli.commands.fit\n"
            "assert 'sympy' not in sys.modules")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_help_exits_0_without_torch():
    code = "import sys, runpy; sys.argv = ['ecotrain', '--help']\ntry:\n    runpy.run_module('ecotrain', run_name='__main__')\n" \
           "except SystemExit as e:\n    assert e.code == 0, e.code\nassert 'torch' not in sys.modules"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "usage: ecotrain" in out.stdout and "fit" in out.stdout


def test_public_names_are_still_importable():
    import ecotrain

    from ecotrain import Callback, Config, EcotrainError, RunResult, TrainState, fit, load_config

    assert callable(fit) and callable(load_config) and issubclass(EcotrainError, Exception)
    assert {Callback.__name__, Config.__name__, RunResult.__name__, TrainState.__name__} == \
        {"Callback", "Config", "RunResult", "TrainState"}
    assert set(ecotrain.__all__) <= set(dir(ecotrain))
    try:
        ecotrain.nope
    except AttributeError as exc:
        assert "nope" in str(exc)
    else:
        raise AssertionError("ecotrain.nope must raise AttributeError")


def test_the_cli_pauses_the_collector_only_for_its_start_up():
    """cli.main runs its start-up without cyclic GC passes (startup.py) and hands the collector back
    as it found it: enabled after a command, still disabled when the caller had disabled it."""
    import gc

    from ecotrain import cli
    from ecotrain.base import startup

    seen = []
    startup.pause()
    seen.append(gc.isenabled())
    startup.resume()
    assert seen == [False] and gc.isenabled()
    assert cli.main(["compare"]) != 0 and gc.isenabled()  # a usage error: the collector is back
    gc.disable()
    try:
        startup.pause()
        startup.resume()  # the caller's choice is not ours to undo
        cli.main(["compare"])
        assert not gc.isenabled()
    finally:
        gc.enable()
