"""`ecotrain report RUN...`: report.html, learning curves, a fit diagnosis, cost, environment; several runs:
comparison and verdict (report/; docs/report.md)."""

from __future__ import annotations

from ecotrain.cli.shared import COST_FIGURES

NAME = "report"
HELP = ("write report.html: learning curves, a fit diagnosis, cost, environment; several runs: "
        "comparison and verdict")
TRAINS = False


def arguments(rp) -> None:
    rp.add_argument("runs", nargs="+", metavar="RUN", help="run folders; a comma list is one group (seeds); with "
                    "two or more groups, each is compared with the first")
    rp.add_argument("--out", help="the HTML file (default RUN/report.html for one run, ./report.html for several)")
    rp.add_argument("--regions", help="grids of the CO2e-by-region chart, e.g. SE,FR,US (default SE,FR,GB,DE,US,CN,IN,PL,AU)")
    rp.add_argument("--by", default="co2e", choices=COST_FIGURES, help="the verdict's cost figure (as compare)")
    rp.add_argument("--metric", default="test_accuracy", help="the verdict's summary.json key (as compare)")
    rp.add_argument("--max-accuracy-drop", type=float, default=0.01)
    rp.add_argument("--min-cost-cut", type=float, default=0.5)


def run(args, ctx) -> int:
    from ecotrain.accounting.compare import split_runs
    from ecotrain.report import DEFAULT_REGIONS, build_report

    groups = [split_runs([item]) for item in args.runs]
    regions = [r for r in args.regions.split(",") if r.strip()] if args.regions else DEFAULT_REGIONS
    path = build_report(groups, args.out, regions, args.by, args.metric, args.max_accuracy_drop, args.min_cost_cut)
    ctx.committed()
    print(f"report: {path}")
    return 0
