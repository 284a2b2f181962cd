"""The one command registry (ecotrain/cli/commands.py): every command registered once, shown by `ecotrain
--help`, its arguments from its owner's light module (imported for that command alone) and its handler
reachable by the name it registered."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ecotrain.cli import program
from ecotrain.cli.commands import BY_NAME, COMMANDS, TRAINS, Command, by_name


def test_every_registered_command_is_in_the_help_in_the_registry_order(capsys):
    with pytest.raises(SystemExit) as done:
        program._parser(["--help"]).parse_args(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    listed = text.split("{", 1)[1].split("}", 1)[0].split(",")  # usage's {fit,plan,...}
    assert listed == [c.name for c in COMMANDS]
    for c in COMMANDS:  # each command's own line: its name, then its help's first words
        assert any(line.split()[:1] == [c.name] for line in text.splitlines()), c.name
        assert " ".join(c.help.replace("%%", "%").split()[:3]) in " ".join(text.split()), c.name


@pytest.mark.parametrize("name", [c.name for c in COMMANDS])
def test_each_command_prints_its_own_help(name, capsys):
    with pytest.raises(SystemExit) as done:
        program._parser([name, "--help"]).parse_args([name, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: ecotrain {name} [-h]") and "options:" in out


def test_each_name_is_registered_once_with_a_handler():
    assert len(BY_NAME) == len(COMMANDS) == len({c.name for c in COMMANDS})
    twice = Command("fit", "again", "ecotrain.cli.fit_args:fit", "ecotrain.cli.fit:cmd_fit")
    with pytest.raises(ValueError, match="'fit' is registered twice"):
        by_name((*COMMANDS, twice))
    for c in COMMANDS:
        assert callable(c.handler()), c.run
        module = c.arguments.split(":")[0]  # beside its feature (or cli/*_args.py), not in cli/program.py
        assert module.endswith("commands") or module.startswith("ecotrain.cli.") and module.endswith("_args"), module


def test_the_training_commands_are_the_ones_a_stop_signal_checkpoints():
    assert set(TRAINS) == {"fit", "resume", "update", "green"}


def test_the_parsers_import_no_torch_and_only_the_named_command_is_built():
    """Every owner's arguments module is light; parsing `plan` imports plan's parser alone."""
    code = ("import sys\nfrom ecotrain.cli import program\nfrom ecotrain.cli.commands import COMMANDS\n"
            "program._parser(['plan', 'r.yaml'])\n"
            "assert 'ecotrain.cli.memory_args' in sys.modules and 'ecotrain.cli.export_args' not in sys.modules\n"
            "program._parser()\n"
            "assert 'torch' not in sys.modules, [c.arguments for c in COMMANDS]")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
