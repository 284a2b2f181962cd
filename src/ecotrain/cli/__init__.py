"""The programs floor's command line (docs/architecture.md): `program.py` parses and dispatches, with the
one error boundary; `commands.py` registers every command; the `*_args.py` modules add a command's
arguments (argparse only, no torch); `fit.py`, `seeds.py`, `models.py`, `records.py` and `corpus.py` are
the handlers, imported only when their command runs. `ecotrain.cli:main` is the console script."""

from ecotrain.cli.program import main

__all__ = ["main"]
