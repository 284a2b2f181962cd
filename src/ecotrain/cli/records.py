"""The bodies of the commands that read runs' records and import no torch: `ledger`, `compare`,
`report` (cli/program.py parses the arguments and dispatches here).

Each handler takes `(args, ctx)`: `ctx` is the CLI's CommandContext (cli/program.py); `report` calls
`ctx.committed()` once its page is written.
"""

from __future__ import annotations

from ecotrain.accounting import read_ledger
from ecotrain.accounting.compare import compare, split_runs
from ecotrain.accounting.report import format_ledger, restate
from ecotrain.base.errors import ConfigError
from ecotrain.report import DEFAULT_REGIONS, build_report


def cmd_ledger(args, ctx) -> int:
    ledger = read_ledger(args.run_dir, table=True)
    print(format_ledger(ledger))
    if args.regions:
        print()
        print(restate(ledger, [r for r in args.regions.split(",") if r.strip()]))
    return 0


def cmd_compare(args, ctx) -> int:
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


def cmd_report(args, ctx) -> int:
    groups = [split_runs([item]) for item in args.runs]
    regions = [r for r in args.regions.split(",") if r.strip()] if args.regions else DEFAULT_REGIONS
    path = build_report(groups, args.out, regions, args.by, args.metric, args.max_accuracy_drop, args.min_cost_cut)
    ctx.committed()
    print(f"report: {path}")
    return 0
