"""The CLI's one error boundary (cli.program._failed): whatever fails inside a command, the terminal gets one
line (what failed, the intact checkpoint and the resume command when there is one, where the
traceback is), the traceback goes to RUN/error.log, `--debug` shows it; user code that calls
sys.exit is a failure, never a silent success."""

import textwrap

import pytest

from conftest import run_cli

DATASETS = textwrap.dedent('''
    import torch

    class Base(torch.utils.data.Dataset):
        labels = torch.arange(64) % 2
        calls = 0
        def __len__(self):
            return 64
        def __getitem__(self, i):
            Base.calls += 1
            if Base.calls > 100:  # in the second epoch: after checkpoints were written
                self.fail()
            return torch.randn(8, generator=torch.Generator().manual_seed(i)), int(i % 2)
        def fail(self):
            pass

    class Quits(Base):
        def fail(self):
            raise SystemExit(0)

    class Breaks(Base):
        def fail(self):
            raise IndexError("list index out of range")

    class Interrupted(Base):
        def fail(self):  # the interrupt met inside a string exec, as in dataclasses' or namedtuple's code
            exec("raise KeyboardInterrupt")
''')
RECIPE = textwrap.dedent('''
    name: boundary
    data: {name: "user_ds:Quits", batch_size: 8, num_classes: 2}
    model: {name: mlp, kwargs: {hidden: [8]}}
    loop: {max_steps: 30, max_epochs: null, log_every: 5}
    checkpoint: {every_n_steps: 2}
    logging: {progress: "off"}
    ledger: {enabled: false}
''')


@pytest.fixture
def world(tmp_path):
    (tmp_path / "user_ds.py").write_text(DATASETS)
    (tmp_path / "r.yaml").write_text(RECIPE)
    return tmp_path


@pytest.mark.parametrize("cls,what", [("Quits", "user code called sys.exit(0)"),
                                      ("Breaks", "IndexError: list index out of range")])
def test_user_code_failing_mid_run_is_one_line_and_a_log(world, cls, what):
    run = world / "run"
    r = run_cli("fit", world / "r.yaml", f"data.name=user_ds:{cls}", "--run-dir", run, cwd=world,
                env={"PYTHONPATH": str(world)})
    assert r.returncode == 1, r.stderr
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in r.stderr, r.stderr
    assert err[0].startswith(f"ecotrain: error: fit failed: {what}")
    assert " in your code at user_ds.py:" in err[0] and " during training step " in err[0]  # the object and the step
    assert "; checkpoint step-" in err[0]
    assert f"is intact: `ecotrain resume {run}` continues from it; traceback in {run / 'error.log'}" in err[0]
    log = (run / "error.log").read_text()
    assert "Traceback" in log and "user_ds.py" in log  # the user's own frame, which they need
    assert not (run / "summary.json").exists()  # an unfinished run is not reported as finished


def test_debug_shows_the_traceback(world):
    r = run_cli("fit", world / "r.yaml", "data.name=user_ds:Breaks", "--run-dir", world / "run", "--debug",
                cwd=world, env={"PYTHONPATH": str(world)})
    assert r.returncode == 1 and "Traceback" in r.stderr and "user_ds.py" in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("ecotrain: error: fit failed: IndexError")


def test_an_interrupt_caught_inside_a_string_exec_still_exits_130(world):
    """CPython marks a KeyboardInterrupt that passed through a string exec as unhandled even once caught,
    and `python -m` then killed the finished CLI with SIGINT (exit -2, seen when SIGTERM hit `ecotrain
    report` inside an import): the CLI's own exit code, 130, is what the caller gets."""
    r = run_cli("fit", world / "r.yaml", "data.name=user_ds:Interrupted", "--run-dir", world / "run", cwd=world,
                env={"PYTHONPATH": str(world)})
    assert r.returncode == 130, (r.returncode, r.stderr)
    assert "ecotrain: interrupted" in r.stderr and "Traceback" not in r.stderr


def test_a_file_error_anywhere_is_one_line(world):
    long = "x" * 300  # over the 255 bytes a name may have
    r = run_cli("fit", world / "r.yaml", "data.name=user_ds:Base", "--run-dir", world / long, cwd=world,
                env={"PYTHONPATH": str(world)})
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "name is too long" in r.stderr


def test_ctrl_c_stops_a_command_that_does_not_train_at_once(world):
    """lr-find used to say "finishing this step, then checkpoint and exit", ignore itself and run to the
    end: a command with nothing to checkpoint stops at the signal, writes nothing, exits 130."""
    import os
    import signal
    import subprocess
    import sys
    import time

    env = {**os.environ, "PYTHONPATH": str(world), "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen([sys.executable, "-m", "ecotrain", "lr-find", str(world / "r.yaml"), "data.name=user_ds:Base",
                          "--steps", "1000000", "--start", "1e-7", "--end", "1e-6", "--out", str(world / "lr.png")],
                         cwd=world, env=env, stderr=subprocess.PIPE, text=True)
    time.sleep(6)  # past start-up, inside the sweep
    assert p.poll() is None
    p.send_signal(signal.SIGINT)
    t = time.monotonic()
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130 and time.monotonic() - t < 10, err
    assert "ecotrain: interrupted" in err and "Traceback" not in err and "finishing this step" not in err
    assert not list(world.glob("lr*"))  # nothing written, not even a temporary
