"""`ecotrain compare BASELINE CANDIDATE`: seed groups' means with 95% intervals and a verdict
(accounting/compare.py; docs/evaluation.md). Reads finished runs: no torch."""

from __future__ import annotations

from ecotrain.cli.shared import COST_FIGURES

NAME = "compare"
HELP = ("baseline vs candidate runs (seed groups): means with 95%% intervals and a verdict (exit 0 "
        "PASS, 1 FAIL or INCONCLUSIVE; docs/evaluation.md)")
TRAINS = False


def arguments(c) -> None:
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


def run(args, ctx) -> int:
    from ecotrain.accounting.compare import compare, split_runs
    from ecotrain.base.errors import ConfigError

    base, cand = split_runs(args.baseline), split_runs(args.candidate)
    pos = list(args.runs)
    if not base and pos:
        base = split_runs([pos.pop(0)])
    if not cand and pos:
        cand = split_runs([pos.pop(0)])
    if pos or not base or not cand:
        raise ConfigError("compare: give BASELINE CANDIDATE (each a run folder or a comma list), "
                          "or --baseline RUN... --candidate RUN...")
    report, ok = compare(base, cand, args.max_accuracy_drop, args.min_cost_cut, args.by, args.metric)
    print(report)
    return 0 if ok else 1
