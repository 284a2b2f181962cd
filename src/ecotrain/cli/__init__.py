"""The programs floor's command line (docs/architecture.md): `program.py` parses and dispatches, with the
one error boundary; `commands/` holds one module per command (its NAME, HELP, TRAINS, `arguments(parser)`
and `run(args, ctx)`; nothing heavy at its top) and registers them by import (`commands/__init__.py`);
`shared.py` holds the flags several commands share, `seeds.py` fit's seed groups. `ecotrain.cli:main` is
the console script."""

from ecotrain.cli.program import main

__all__ = ["main"]
