"""docs/cli.md's exit-code table is the code's: every code it lists is one ecotrain returns (base/errors.py),
and each row is shown by a real command here (in this process, through the CLI's `main`), or, for the
signal rows that need a real process and signal, by the test named for it."""

import re
from pathlib import Path

import pytest

from ecotrain.base import errors
from ecotrain.cli import main

ROOT = Path(__file__).resolve().parents[2]
TINY = ["data.num_samples=300", "loop.max_steps=2", "loop.eval_every=2", "ledger.enabled=false"]
RECIPE = str(ROOT / "recipes" / "mnist1d_cnn.yaml")
# rows shown elsewhere: a real process stopped by a real signal (file, the assertion it holds)
SIGNAL_ROWS = {75: ("tests/integration/test_preemption_notice.py", "r.returncode == 75"),
               130: ("tests/integration/test_error_boundary.py", "r.returncode == 130")}


def table_codes() -> set[int]:
    text = (ROOT / "docs" / "cli.md").read_text()
    block = text.split("## Exit codes", 1)[1]
    return {int(m.group(1)) for m in re.finditer(r"^\| (\d+) \|", block, re.M)}


def test_the_table_lists_exactly_the_codes_ecotrain_returns():
    constants = {v for k, v in vars(errors).items() if k.startswith("EXIT_")}
    assert table_codes() == constants | {130}  # 130: the second Ctrl-C, the CLI's own (cli/program.py)


def _ran(capsys, *args) -> tuple[int, str]:
    code = main([str(a) for a in args])
    return code, capsys.readouterr().err


def test_0_finished(tmp_path, capsys):
    assert _ran(capsys, "fit", RECIPE, *TINY, "--run-dir", tmp_path / "run", "--quiet")[0] == 0


def test_1_a_failure_inside_a_command(tmp_path, capsys, monkeypatch):
    (tmp_path / "boom.py").write_text("import torch\nclass Boom(torch.nn.Module):\n    def __init__(self):\n"
                                      "        super().__init__(); self.w = torch.nn.Linear(40, 10)\n"
                                      "    def forward(self, x):\n        raise IndexError('the user model failed')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code, err = _ran(capsys, "fit", RECIPE, *TINY, "model.name=boom:Boom", "--run-dir", tmp_path / "run")
    assert code == 1 and "IndexError: the user model failed" in err and "Traceback" not in err


def test_2_bad_config_and_2_a_file_that_cannot_be_written(tmp_path, capsys):
    code, err = _ran(capsys, "fit", RECIPE, "loop.bogus=1")
    assert code == 2 and "loop.bogus" in err
    (tmp_path / "file").write_text("")
    code, err = _ran(capsys, "fit", RECIPE, *TINY, "--run-dir", tmp_path / "file" / "run")
    assert code == 2 and "is a file" in err


def test_3_a_model_file_that_cannot_be_read(tmp_path, capsys):
    assert _ran(capsys, "fit", RECIPE, *TINY, "--run-dir", tmp_path / "run", "--quiet")[0] == 0
    (tmp_path / "run" / "model.safetensors").write_bytes(b"\x00" * 64)
    code, err = _ran(capsys, "eval", tmp_path / "run")
    assert code == 3 and "model.safetensors" in err and "Traceback" not in err


def test_4_diverged(tmp_path, capsys):
    code, err = _ran(capsys, "fit", RECIPE, "data.num_samples=300", "loop.max_steps=20", "ledger.enabled=false",
                     "optim.lr=1e30", "--run-dir", tmp_path / "run", "--quiet")
    assert code == 4, err


@pytest.mark.parametrize("code", sorted(SIGNAL_ROWS))
def test_the_signal_rows_have_their_tests(code):
    path, assertion = SIGNAL_ROWS[code]
    assert assertion in (ROOT / path).read_text()
