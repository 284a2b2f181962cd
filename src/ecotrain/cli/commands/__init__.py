"""Every `ecotrain` command, one module each, registered here by import in the order `ecotrain --help`
shows them.

A command's module defines `NAME` (its word on the command line), `HELP` (its line in `ecotrain --help`),
`TRAINS` (True: a stop signal finishes the step and checkpoints; False: it stops at once), `arguments(parser)`
(adds its arguments to its subparser, argparse only) and `run(args, ctx) -> int` (the handler; `ctx` is
cli/program.py's CommandContext). The registry imports every command's module, for `ecotrain --help` too:
a module imports nothing heavy at its top (torch, numpy, the assembly); `run()` imports what it needs.
What several commands share is cli/shared.py (their flags) and cli/seeds.py (fit's seed groups).

A new command: its module here, and its name in the import and in COMMANDS."""

from __future__ import annotations

from ecotrain.cli.commands import (bn_report, canary, card, compare, data, eval, export, fit, green, ledger, lr_find,
                                   plan, predict, promote, report, resume, review_queue, rollback, speech_feedback,
                                   tokenize, update, versions)

COMMANDS = (fit, plan, resume, ledger, compare, eval, predict, export, card, bn_report, report, tokenize, lr_find,
            update, versions, promote, rollback, canary, review_queue, data, speech_feedback, green)

_DEFINES = (("NAME", str), ("HELP", str), ("TRAINS", bool), ("arguments", callable), ("run", callable))


def _missing(module) -> list[str]:
    return [name for name, kind in _DEFINES
            if not hasattr(module, name) or not (kind(getattr(module, name)) if kind is callable
                                                  else isinstance(getattr(module, name), kind))]


def by_name(commands=COMMANDS) -> dict:
    """name -> the command's module. A module that lacks one of NAME, HELP, TRAINS, arguments, run, or a name
    registered twice, is refused at import of the registry, named (argparse would refuse a name twice only
    once the parser is built, a missing handler only when its command runs)."""
    named: dict = {}
    for module in commands:
        missing = _missing(module)
        if missing:
            raise TypeError(f"command module {getattr(module, '__name__', module)!r} lacks {', '.join(missing)}: "
                            "each command's module defines NAME (str), HELP (str), TRAINS (bool), "
                            "arguments(parser) and run(args, ctx) (ecotrain/cli/commands/)")
        if module.NAME in named:
            raise ValueError(f"command {module.NAME!r} is registered twice (ecotrain/cli/commands/): "
                             f"{named[module.NAME].__name__} and {module.__name__}")
        named[module.NAME] = module
    return named


BY_NAME = by_name()
TRAINS = tuple(c.NAME for c in COMMANDS if c.TRAINS)  # a stop signal finishes the step and checkpoints
