"""`ecotrain ledger RUN [--regions SE,FR]`: a run's cost ledger, its CO2e restated on other grids
(accounting/report.py). Reads a finished run: no torch."""

from __future__ import annotations

NAME = "ledger"
HELP = "print a run's cost ledger; --regions restates its CO2e on other grids"
TRAINS = False


def arguments(lg) -> None:
    lg.add_argument("run_dir")
    lg.add_argument("--regions", help="comma-separated country codes, e.g. SE,FR,US,PL")


def run(args, ctx) -> int:
    from ecotrain.accounting import read_ledger
    from ecotrain.accounting.report import format_ledger, restate

    ledger = read_ledger(args.run_dir, table=True)
    print(format_ledger(ledger))
    if args.regions:
        print()
        print(restate(ledger, [r for r in args.regions.split(",") if r.strip()]))
    return 0
