"""Every `ecotrain` command, the one place they are registered: each is a `command.Command` defined by
the module that owns it (its parser beside its feature, argparse only), listed here in the order
`ecotrain --help` shows them. cli.py builds the parser from this list and dispatches by it.

A new command: its `Command` in its owner's commands module, its handler, and a line here."""

from __future__ import annotations

from ecotrain import fit_commands, inference_commands, lrfind_commands, tokenize_commands
from ecotrain.accounting import commands as accounting
from ecotrain.command import Command
from ecotrain.continual import commands as continual
from ecotrain.export import commands as export
from ecotrain.green import commands as green
from ecotrain.memory import commands as memory
from ecotrain.report import commands as report
from ecotrain.speech import commands as speech

COMMANDS: tuple[Command, ...] = (
    fit_commands.FIT, memory.PLAN, fit_commands.RESUME, accounting.LEDGER, accounting.COMPARE,
    inference_commands.EVAL, inference_commands.PREDICT, export.EXPORT, export.CARD, report.BN_REPORT,
    report.REPORT, tokenize_commands.TOKENIZE, lrfind_commands.LR_FIND,
    *continual.COMMANDS,  # update, versions, promote, rollback, review-queue (docs/updates.md)
    *speech.COMMANDS,  # data speech-digits, speech-feedback (docs/speech.md)
    green.GREEN,  # docs/green.md
)


def by_name(commands=COMMANDS) -> dict[str, Command]:
    """name -> Command; a name registered twice is refused at import, named (argparse would refuse it
    only once the parser is built)."""
    named: dict[str, Command] = {}
    for c in commands:
        if c.name in named:
            raise ValueError(f"command {c.name!r} is registered twice (ecotrain/commands.py)")
        named[c.name] = c
    return named


BY_NAME = by_name()
TRAINS = tuple(c.name for c in COMMANDS if c.trains)  # a stop signal finishes the step and checkpoints
