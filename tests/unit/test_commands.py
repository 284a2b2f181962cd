"""The one command registry (ecotrain/commands.py): every command registered once, by the module that
owns it, shown by `ecotrain --help`, and its handler reachable by the name it registered."""

from __future__ import annotations

import importlib

import pytest

from ecotrain import cli
from ecotrain.command import Command
from ecotrain.commands import BY_NAME, COMMANDS, TRAINS, by_name


def test_every_registered_command_is_in_the_help_in_the_registry_order(capsys):
    with pytest.raises(SystemExit) as done:
        cli._parser().parse_args(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    listed = text.split("{", 1)[1].split("}", 1)[0].split(",")  # usage's {fit,plan,...}
    assert listed == [c.name for c in COMMANDS]
    for c in COMMANDS:  # each command's own line: its name, then its help's first words
        assert any(line.split()[:1] == [c.name] for line in text.splitlines()), c.name
        assert c.help.replace("%%", "%").split()[0] in text, c.name


@pytest.mark.parametrize("name", [c.name for c in COMMANDS])
def test_each_command_prints_its_own_help(name, capsys):
    with pytest.raises(SystemExit) as done:
        cli._parser().parse_args([name, "--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: ecotrain {name} [-h]")


def test_each_name_is_registered_once_and_by_its_owner():
    assert len(BY_NAME) == len(COMMANDS) == len({c.name for c in COMMANDS})
    for c in COMMANDS:  # the parser lives in a commands module beside its feature, not in the CLI
        assert c.add_arguments.__module__.endswith("commands"), (c.name, c.add_arguments.__module__)
    twice = Command("fit", "again", lambda p: None, "ecotrain.cli_fit:cmd_fit")
    with pytest.raises(ValueError, match="'fit' is registered twice"):
        by_name((*COMMANDS, twice))


def test_the_training_commands_are_the_ones_a_stop_signal_checkpoints():
    assert set(TRAINS) == {"fit", "resume", "update", "green"}


def test_each_handler_is_where_its_command_says():
    for c in COMMANDS:
        module, _, name = c.run.partition(":")
        assert callable(getattr(importlib.import_module(module), name)), c.run
