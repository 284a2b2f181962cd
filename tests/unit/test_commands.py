"""The one command registry (ecotrain/cli/commands/): one module per command, registered by import, every
command once, shown by `ecotrain --help` in the registry's order, its arguments and its `run` in its own
module; a module that lacks one of them is refused when the registry is imported; no command's help
imports torch."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

from ecotrain.cli import program
from ecotrain.cli.commands import BY_NAME, COMMANDS, TRAINS, by_name


def test_every_registered_command_is_in_the_help_in_the_registry_order(capsys):
    with pytest.raises(SystemExit) as done:
        program._parser(["--help"]).parse_args(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    listed = text.split("{", 1)[1].split("}", 1)[0].split(",")  # usage's {fit,plan,...}
    assert listed == [c.NAME for c in COMMANDS]
    assert listed[:3] == ["fit", "plan", "resume"] and listed[-1] == "green"
    for c in COMMANDS:  # each command's own line: its name, then its help's first words
        assert any(line.split()[:1] == [c.NAME] for line in text.splitlines()), c.NAME
        assert " ".join(c.HELP.replace("%%", "%").split()[:3]) in " ".join(text.split()), c.NAME


@pytest.mark.parametrize("name", [c.NAME for c in COMMANDS])
def test_each_command_prints_its_own_help(name, capsys):
    with pytest.raises(SystemExit) as done:
        program._parser([name, "--help"]).parse_args([name, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: ecotrain {name} [-h]") and "options:" in out


def test_each_name_is_registered_once_by_its_own_module():
    assert len(BY_NAME) == len(COMMANDS) == len({c.NAME for c in COMMANDS})
    for c in COMMANDS:  # cli/commands/<name>.py, its word on the command line with - for _
        assert c.__name__ == "ecotrain.cli.commands." + c.NAME.replace("-", "_"), c.__name__
        assert callable(c.arguments) and callable(c.run) and isinstance(c.TRAINS, bool), c.NAME
    twice = types.ModuleType("ecotrain.cli.commands.fit_again")
    twice.__dict__.update(NAME="fit", HELP="again", TRAINS=True, arguments=lambda p: None, run=lambda a, c: 0)
    with pytest.raises(ValueError, match="'fit' is registered twice"):
        by_name((*COMMANDS, twice))


@pytest.mark.parametrize("lacks", ["NAME", "HELP", "TRAINS", "arguments", "run"])
def test_a_command_module_that_lacks_a_definition_is_refused_naming_it(lacks):
    broken = types.ModuleType("ecotrain.cli.commands.broken")
    broken.__dict__.update(NAME="broken", HELP="a command", TRAINS=False, arguments=lambda p: None,
                           run=lambda a, c: 0)
    delattr(broken, lacks)
    with pytest.raises(TypeError) as refused:
        by_name((*COMMANDS, broken))
    said = str(refused.value)
    assert said.startswith("command module 'ecotrain.cli.commands.broken' lacks ") and lacks in said
    assert "NAME (str), HELP (str), TRAINS (bool), arguments(parser) and run(args, ctx)" in said


def test_the_registry_refuses_a_broken_module_when_it_is_imported():
    """A module of the registry without `run`: importing ecotrain.cli.commands fails, with one line naming it."""
    code = ("import sys, types\n"
            "stub = types.ModuleType('ecotrain.cli.commands.card')\n"
            "stub.NAME, stub.HELP, stub.TRAINS, stub.arguments = 'card', 'a card', False, lambda p: None\n"
            "sys.modules['ecotrain.cli.commands.card'] = stub\n"
            "import ecotrain.cli.commands\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert "TypeError: command module 'ecotrain.cli.commands.card' lacks run:" in out.stderr.splitlines()[-1]


def test_the_training_commands_are_the_ones_a_stop_signal_checkpoints():
    assert set(TRAINS) == {"fit", "resume", "update", "green"}


def test_every_help_exits_0_and_imports_no_torch():
    """`ecotrain --help` and every `ecotrain CMD --help`, through main() as the program runs them, in one
    process: the registry imports every command's module, so none may import torch (or numpy) at its top."""
    code = ("import contextlib, io, sys\n"
            "from ecotrain.cli import main\n"
            "from ecotrain.cli.commands import COMMANDS\n"
            "for argv in [['--help'], *([c.NAME, '--help'] for c in COMMANDS)]:\n"
            "    out = io.StringIO()\n"
            "    with contextlib.redirect_stdout(out):\n"
            "        try:\n"
            "            main(argv)\n"
            "        except SystemExit as e:\n"
            "            assert e.code == 0, (argv, e.code)\n"
            "        else:\n"
            "            raise AssertionError(argv)\n"
            "    assert out.getvalue().startswith('usage: ecotrain'), argv\n"
            "    heavy = [m for m in ('torch', 'numpy') if m in sys.modules]\n"
            "    assert not heavy, (argv, heavy)\n"
            "print(len(COMMANDS))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(len(COMMANDS))]
