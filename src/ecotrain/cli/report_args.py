"""The arguments of the commands that report on finished runs: `report` (__init__.py; docs/report.md) and
`bn-report` (methods/batchnorm.py's report). Argparse only, no torch: imported to parse its command, before
torch (ecotrain/cli/commands.py lists the commands); the handlers are in cli/records.py and cli/models.py."""

from __future__ import annotations

from ecotrain.cli.accounting_args import COST_FIGURES


def report(rp) -> None:
    rp.add_argument("runs", nargs="+", metavar="RUN", help="run folders; a comma list is one group (seeds); with "
                    "two or more groups, each is compared with the first")
    rp.add_argument("--out", help="the HTML file (default RUN/report.html for one run, ./report.html for several)")
    rp.add_argument("--regions", help="grids of the CO2e-by-region chart, e.g. SE,FR,US (default SE,FR,GB,DE,US,CN,IN,PL,AU)")
    rp.add_argument("--by", default="co2e", choices=COST_FIGURES, help="the verdict's cost figure (as compare)")
    rp.add_argument("--metric", default="test_accuracy", help="the verdict's summary.json key (as compare)")
    rp.add_argument("--max-accuracy-drop", type=float, default=0.01)
    rp.add_argument("--min-cost-cut", type=float, default=0.5)


def bn_report(bn) -> None:
    bn.add_argument("run_dir")
