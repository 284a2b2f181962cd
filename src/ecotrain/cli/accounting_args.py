"""The arguments of the commands that read cost ledgers: `ledger` (report.py) and `compare` (compare.py;
docs/evaluation.md). Argparse only, no torch: imported to parse its command, before torch
(ecotrain/cli/commands.py lists the commands); the handlers are in cli/records.py."""

from __future__ import annotations

COST_FIGURES = ["flops", "cpu_seconds", "wall_seconds", "energy", "co2e", "cost"]  # --by of compare, fit, report


def ledger(lg) -> None:
    lg.add_argument("run_dir")
    lg.add_argument("--regions", help="comma-separated country codes, e.g. SE,FR,US,PL")


def compare(c) -> None:
    c.add_argument("runs", nargs="*", metavar="RUN", help="BASELINE CANDIDATE; each may be a group file "
                   "(fit --seeds) or a comma list of run folders (seeds), e.g. a1,a2,a3 b1,b2,b3")
    c.add_argument("--baseline", nargs="+", metavar="RUN", help="baseline run folders (instead of the positionals)")
    c.add_argument("--candidate", nargs="+", metavar="RUN", help="candidate run folders")
    c.add_argument("--max-accuracy-drop", type=float, default=0.01, help="absolute, inclusive (default 0.01); "
                   "with several seeds per side the drop's 95%% interval must lie within it")
    c.add_argument("--min-cost-cut", type=float, default=0.5, help="fraction of the baseline's mean cost "
                   "(default 0.5)")
    c.add_argument("--by", default="co2e", choices=COST_FIGURES,
                   help="the cost figure (default co2e); flops is counted, the others are measured")
    c.add_argument("--metric", default="test_accuracy", help="summary.json key (default test_accuracy)")
