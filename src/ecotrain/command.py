"""One command of `ecotrain`, as the module that owns it registers it (ecotrain/commands.py lists them
all): its name, its one-line help, the function that adds its arguments to its subparser (argparse only:
`ecotrain --help` imports it, and must not import torch) and its handler as "module:function", imported
only when the command runs (cli._dispatch). A plain class: a dataclass costs start-up time to build."""

from __future__ import annotations


class Command:
    __slots__ = ("name", "help", "add_arguments", "run", "trains")

    def __init__(self, name: str, help: str, add_arguments, run: str, trains: bool = False) -> None:
        self.name = name
        self.help = help
        self.add_arguments = add_arguments  # (argparse.ArgumentParser) -> None
        self.run = run  # "module:function" of the handler, called as handler(args, cli.CommandContext)
        self.trains = trains  # a stop signal finishes the step and checkpoints; the others stop at once

    def __repr__(self) -> str:
        return f"Command({self.name!r}, run={self.run!r})"
