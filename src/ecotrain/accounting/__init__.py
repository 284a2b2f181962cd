"""The cost ledger: FLOPs, wall and CPU time, device-hours, energy, CO2e and money of every run,
budgets that stop a run cleanly, and the comparison of runs with a verdict (docs/ledger.md).

flops.py counts one step exactly; energy.py owns CodeCarbon and grid intensities; prices.py
device-hours and their price; budget.py limits and the forecast; ledger.py the callback that puts
them together; report.py reads, prints and restates ledgers; compare.py compares runs.
"""

__all__ = ["Ledger", "read_ledger", "summary_line", "write_ledger"]


def __getattr__(name: str):  # the Ledger imports torch; readers of finished runs (report, compare) need none,
    if name == "Ledger":  # and `ecotrain --help` (cli/commands/ledger.py, compare.py) not even the ledger's reader
        from ecotrain.accounting.ledger import Ledger
        return Ledger
    if name in ("read_ledger", "summary_line", "write_ledger"):
        from ecotrain.accounting import report
        return getattr(report, name)
    raise AttributeError(name)
