"""`ecotrain green RECIPE`: search the cheapest recipe whose validation accuracy stays within a tolerance of
RECIPE's, choose on validation, confirm on fresh seeds, say what it cost (assembly/green_search.py,
green_confirm.py, green/; docs/green.md)."""

from __future__ import annotations

NAME = "green"
HELP = ("search the cheapest recipe whose validation accuracy stays within a tolerance of RECIPE's, "
        "then confirm it on fresh seeds (docs/green.md)")
TRAINS = True
FRESH_FROM = 10  # `--seeds-confirm 5` means seeds 10-14 (docs/evaluation.md: fresh seeds 10-14)


def arguments(g) -> None:
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
    if text.strip().isascii() and text.strip().isdigit():  # "²" is a digit to isdigit, not to int
        n = int(text)
        if n == 0:
            return None
        return f"{FRESH_FROM}-{FRESH_FROM + n - 1}" if n > 1 else str(FRESH_FROM)
    return text


def run(args, ctx) -> int:
    """`ctx`: the CLI's CommandContext; every run of the search and the confirmation trains under its
    `preemption` (the stop-signal handler)."""
    import math
    from pathlib import Path

    from ecotrain.assembly import green_confirm as confirm_mod
    from ecotrain.assembly.green_search import BY, Options, run_search
    from ecotrain.assembly.trainer import fit
    from ecotrain.base.errors import ConfigError
    from ecotrain.base.rundir import write_json
    from ecotrain.config import load_config
    from ecotrain.config.carbon import cli_overrides
    from ecotrain.green import costmodel, output
    from ecotrain.green import plan as plan_mod
    from ecotrain.seeds.sweep import parse_seeds

    for flag, value in (("--spot-price-ratio", args.spot_price_ratio),
                        ("--preemptions-per-hour", args.preemptions_per_hour)):
        if not (math.isfinite(value) and value >= 0):
            raise ConfigError(f"{flag} {value}: give a finite number >= 0")
    for flag, value in (("--tolerance", args.tolerance), ("--budget-runs", args.budget_runs),
                        ("--min-cost-cut", args.min_cost_cut), ("--margin", args.margin)):
        if value is not None and not math.isfinite(value):  # NaN passed every `<` check below, and failed them all later
            raise ConfigError(f"{flag} {value}: give a finite number")
    if args.tolerance < 0 or args.budget_runs <= 0 or args.trials < 1:
        raise ConfigError("--tolerance must be >= 0, --budget-runs > 0 and --trials >= 1")
    if args.min_cost_cut > 1:  # compare would refuse it too, but only after the whole search
        raise ConfigError(f"--min-cost-cut {args.min_cost_cut:g}: a fraction of the baseline's cost, at most 1 "
                          "(e.g. 0.5)")
    plan_mod.check_region(args.plan_region)
    overrides = [*args.overrides, *cli_overrides(args.carbon_forecast, args.deadline)]
    if any(o.split("=", 1)[0].strip() == "seed" for o in overrides):
        raise ConfigError("ecotrain green: --seed sets the design seed and --seeds-confirm the fresh ones; "
                          "drop the seed=... override")
    fresh = confirm_seeds(args.seeds_confirm)
    checks = [] if args.check_seeds.strip().lower() == "none" else parse_seeds(args.check_seeds)
    if args.seed in checks:
        raise ConfigError(f"--check-seeds {args.check_seeds}: includes the design seed {args.seed} (--seed)")
    if fresh is not None:
        confirm_mod.check_seeds([args.seed, *checks], fresh)
        if args.until_decided:  # the confirmation's flags are checked before the search trains anything
            from ecotrain.seeds.decide import check_max_seeds
            check_max_seeds(parse_seeds(fresh), args.max_seeds)
    cfg = load_config(args.recipe, overrides)  # a bad recipe or override: one line, before anything trains
    metered = cfg.ledger.energy != "off" and cfg.ledger.enabled
    if args.by is None:  # what is paid, measured; a recipe that measures no energy: counted FLOPs, said so
        args.by = "energy" if metered else "flops"
        if not metered:
            print("ecotrain green: the recipe measures no energy (ledger.energy=off): ranking by counted FLOPs; "
                  "--by cpu_seconds ranks by measured CPU time", flush=True)
    if args.by in ("energy", "co2e") and not metered:
        raise ConfigError(f"--by {args.by}: the recipe does not measure energy (ledger.energy=off); use --by flops, "
                          "or turn ledger.energy on")
    out = Path(args.out or f"runs/{cfg.name}-green")
    levers = [x.strip() for x in args.levers.split(",") if x.strip()] if args.levers else None
    if args.margin is not None and not 0 <= args.margin <= args.tolerance:
        raise ConfigError(f"--margin {args.margin:g}: between 0 and the tolerance ({args.tolerance:g})")
    if not (math.isfinite(args.calibrate) and 0 <= args.calibrate <= 1):
        raise ConfigError(f"--calibrate {args.calibrate}: a fraction of the baseline's steps between 0 and 1 (e.g. 0.1)")
    opts = Options(args.recipe, overrides, out, args.tolerance, args.margin, args.trials, args.budget_runs, args.by,
                   args.seed, levers, f"val_{args.metric}", preemption=ctx.preemption, check_seeds=tuple(checks),
                   calibrate=args.calibrate)

    def shown(row):
        what = " ".join(row.overrides) if row.state != "skipped" else row.why
        figs = "" if row.ratio is None else f": {row.ratio:.3f}x, validation deficit {row.deficit:+.4f}"
        print(f"trial {row.number} {row.state}{figs} ({what})", flush=True)

    search = run_search(opts, shown)
    output.write_trials(out, search)
    print()
    print(output.trials_table(search))
    base_cost = search.baseline["cost"]
    design = search.spent
    costs = {"baseline (design seed)": base_cost, f"trials ({len(search.rows)})": sum(r.cost or 0.0 for r in search.rows),
             f"checks on design seeds {args.check_seeds} ({len(search.checks)} runs)": sum(c["cost"] for c in search.checks)}
    if search.probes:
        costs[f"calibration probes ({len(search.probes)})"] = sum(p["cost"] for p in search.probes)
    if search.chosen is None:
        output.write_html(out, search, args.tolerance, args.by, costs=costs)
        print(f"no trial kept {opts.metric} within {opts.allowed:g} of the baseline's; nothing written to "
              f"{out / 'green.yaml'} (see {out / 'green.html'})")
        return 1
    green_yaml = out / "green.yaml"
    output.write_recipe(green_yaml, args.recipe, overrides, search, args.tolerance, args.by)
    print(f"\nchosen on validation: trial {search.chosen.number}, {search.chosen.ratio:.3f}x the baseline's {args.by}; "
          f"wrote {green_yaml}")
    result, saving = None, base_cost - (search.chosen.cost or 0.0)
    if fresh is not None:
        print(f"\n== confirmation on fresh seeds {fresh} (test split read once per run)")
        result = confirm_mod.confirm(args.recipe, overrides, green_yaml, out, fresh, args.tolerance, BY[args.by],
                                     args.min_cost_cut, f"test_{args.metric}", preemption=ctx.preemption,
                                     max_seeds=args.max_seeds if args.until_decided else None,
                                     avoid=[args.seed, *checks])
        print(result.report)
        (out / "verdict.txt").write_text(result.report + "\n")
        saving = result.saving
        said = fresh if result.decision is None else ",".join(map(str, result.decision.seeds))
        costs.update({f"confirmation, baseline ({said})": result.costs["baseline"],
                      f"confirmation, green ({said})": result.costs["green"]})
    total = sum(costs.values())
    payback = confirm_mod.payback_runs(total, saving)
    costs["total"] = total
    the_plan = plan_mod.write_plan(out, search, result, args.recipe, overrides, args.seed, args.plan_region,
                                   args.carbon_forecast, args.deadline, args.spot_price_ratio,
                                   args.preemptions_per_hour, cfg.checkpoint.every_minutes, fit=fit)
    html = output.write_html(out, search, args.tolerance, args.by, result, payback, costs, the_plan)
    pruned = sum(r.state == "pruned" for r in search.rows)
    skipped = sum(r.state == "skipped" for r in search.rows)
    print(f"\nsearch cost ({args.by}): design {design / base_cost:.2f} baseline runs (the baseline, "
          f"{len(search.rows)} trials: {pruned} pruned, {skipped} skipped untrained, {len(search.checks)} check runs"
          f" and {len(search.probes)} calibration probes)"
          + (f", with the confirmation {total / base_cost:.2f}" if result else ""))
    model = costmodel.hindsight(search.rows)
    if model["predicted"] or model["skipped"]:
        err = model["median_abs_error"]
        print(f"fitted cost model: {model['skipped']} trials skipped untrained on its prediction; "
              f"{model['predicted']} predicted before they trained"
              + (f", median error {100 * err:.1f}%" if err is not None else ""))
    print(f"pays back after {payback} production runs: the search's own {args.by} ({total:.3g}, {total / base_cost:.2f} "
          f"baseline runs: every trial, check, probe and confirmation run) over the saving per run ({saving:.3g})"
          if payback is not None else "the green recipe saves nothing per run: the search never pays back")
    write_json(out / "green.json", {
        "chosen": search.chosen.number, "overrides": search.chosen.overrides, "by": args.by,
        "check_deficit": search.chosen.check_deficit, "check_se": search.chosen.check_se, "check_seeds": checks,
        "tolerance": args.tolerance, "design_seed": args.seed, "fresh_seeds": fresh,
        "design_cost_ratio": search.chosen.ratio, "validation_deficit": search.chosen.deficit,
        "search_cost_baselines": design / base_cost, "total_cost_baselines": total / base_cost,
        "costs": costs, "saving_per_run": saving, "payback_runs": payback,
        "trials": len(search.rows), "pruned": pruned, "skipped": skipped, "cost_model": model,
        "verdict": result.verdict if result else None,
        "decision": None if result is None or result.decision is None else {
            "seeds": result.decision.seeds, "looks": result.decision.looks, "forecast": result.decision.forecast,
            "added_cost": result.decision.added_cost},
        "cost_ratio": result.cost_ratio if result else None,
        "drop": {"mean": result.drop.mean, "low": result.drop.low, "high": result.drop.high, "n": result.drop.n}
        if result else None})
    for row in plan_mod.lines(the_plan):
        if row[0].startswith("total"):
            print(f"plan, {row[0]}: {row[2]} ({row[4]})")
    print(f"plan: {out / 'plan.md'} (model and data measured; region, timing and spot price modelled)")
    print(f"report: {html}")
    return 0 if result is None or result.passed else 1
