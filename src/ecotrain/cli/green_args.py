"""`ecotrain green RECIPE`'s arguments (docs/green.md). Argparse only, no torch: imported to parse the
command, before torch (ecotrain/cli/commands.py lists the commands). The body, search, choice on validation,
confirmation on fresh seeds and what it cost, is cli/green.py, imported when the command runs."""

from __future__ import annotations

FRESH_FROM = 10  # `--seeds-confirm 5` means seeds 10-14 (docs/evaluation.md: fresh seeds 10-14)


def green(g) -> None:
    g.add_argument("recipe", help="the baseline recipe YAML")
    g.add_argument("overrides", nargs="*", help="dotted overrides of the baseline, e.g. ledger.energy=off")
    g.add_argument("--tolerance", type=float, default=0.01, help="largest allowed drop of the metric (default 0.01)")
    g.add_argument("--margin", type=float, help="the search keeps the validation deficit within tolerance - margin "
                   "on the design seed (default: half the tolerance; the fresh seeds judge the tolerance itself)")
    g.add_argument("--budget-runs", type=float, default=6.0, help="the search's cost cap, in baseline runs of the "
                   "--by figure, the baseline's own run included (default 6)")
    g.add_argument("--trials", type=int, default=12, help="trials that train, at most (default 12)")
    g.add_argument("--seeds-confirm", default="5", metavar="N|SEEDS", help="fresh seeds for the confirmation: a count "
                   f"(5: seeds {FRESH_FROM}-{FRESH_FROM + 4}) or a list (10-14); 0: no confirmation")
    g.add_argument("--until-decided", action="store_true", help="the confirmation adds one fresh seed per side at a "
                   "time until its verdict is PASS or FAIL (an interval valid at every look; docs/evaluation.md)")
    g.add_argument("--max-seeds", type=int, default=20, help="--until-decided stops here (default 20 per side)")
    g.add_argument("--seed", type=int, default=0, help="the design seed of the baseline and every trial (default 0)")
    g.add_argument("--check-seeds", default="1,2", help="more design seeds on which the cheapest feasible trials "
                   "are trained again before one is chosen (validation only; default 1,2; none: no check)")
    g.add_argument("--by", default=None, choices=["energy", "co2e", "money", "cpu_seconds", "flops"],
                   help="the cost to minimise (default energy, or flops where the recipe measures none: "
                   "ledger.energy=off); energy, CO2e, money and CPU-seconds are measured, each trial against a "
                   "calibration probe of the baseline timed just before it; flops are counted")
    g.add_argument("--calibrate", type=float, default=0.1, help="a calibration probe's length as a fraction of the "
                   "baseline's steps (default 0.1; 0: no probes, every trial against the baseline's one run)")
    g.add_argument("--min-cost-cut", type=float, default=0.5, help="the confirmation's cost criterion, as compare's "
                   "(default 0.5)")
    g.add_argument("--levers", help="comma list of levers to search (default: every one that applies): "
                   "schedule,batch,width,prune,selective,ema,stability")
    g.add_argument("--metric", default="accuracy", help="the metric, without its split prefix (default accuracy: "
                   "val_accuracy in the search, test_accuracy in the confirmation)")
    g.add_argument("--out", help="output folder (default runs/<recipe name>-green)")
    g.add_argument("--carbon-forecast", metavar="FILE", help="time every run by this grid-intensity forecast "
                   "(passed to each run as carbon.forecast; docs/green.md)")
    g.add_argument("--deadline", help="with --carbon-forecast: each run's deadline (ISO time, or a duration "
                   "from its start such as 12h)")
    g.add_argument("--plan-region", metavar="COUNTRY", help="the plan's grid region (a country code, e.g. SE): its "
                   "intensity against the run's, modelled from CodeCarbon's data (plan.json; green/plan.py)")
    g.add_argument("--spot-price-ratio", type=float, default=0.35, help="the plan's spot price as a fraction of "
                   "on-demand (modelled; default 0.35)")
    g.add_argument("--preemptions-per-hour", type=float, default=0.2, help="the plan's spot preemption rate per "
                   "training hour (modelled; default 0.2); what one costs is measured on the search's runs")


def confirm_seeds(text: str) -> str | None:
    """`--seeds-confirm`: a count N (seeds 10..10+N-1), a seed list, or 0 (none)."""
    if text.strip().isdigit():
        n = int(text)
        if n == 0:
            return None
        return f"{FRESH_FROM}-{FRESH_FROM + n - 1}" if n > 1 else str(FRESH_FROM)
    return text
