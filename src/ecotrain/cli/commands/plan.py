"""`ecotrain plan RECIPE`: the memory a recipe needs, estimated, measured, and with --budget the plan fit
would pick (docs/memory.md: memory/estimate.py, measure.py, planner.py)."""

from __future__ import annotations

import os

NAME = "plan"
HELP = "print the memory a recipe needs (parameters, gradients, optimizer, activations)"
TRAINS = False


def arguments(pl) -> None:
    pl.add_argument("recipe")
    pl.add_argument("overrides", nargs="*", help="dotted overrides, e.g. data.batch_size=4")
    pl.add_argument("--budget", metavar="BYTES", help="measure plans (recompute, offload, chunked loss, optimizer offload, micro-batches) for this much "
                    "memory, e.g. 2GiB, and print the one fit would pick (memory.budget; docs/memory.md)")
    pl.add_argument("--out", metavar="HTML", help="with --budget: also write the measurements and the Pareto front "
                    "(memory vs step time) as a page")
    measure = pl.add_mutually_exclusive_group()
    measure.add_argument("--measure", action="store_true", default=None, help="measure the peak of memory.search_steps "
                         "real training steps in a fresh process, on CPU too (there: its peak RSS, interpreter "
                         "included); the default on CUDA")
    measure.add_argument("--no-measure", dest="measure", action="store_false", help="on CUDA: the estimate only")


def run(args, ctx) -> int:
    """Under torchrun, rank 0 plans for the job's world size (its own measuring groups); the others end."""
    from ecotrain.base.errors import ConfigError
    from ecotrain.config import load_config
    from ecotrain.core import threads
    from ecotrain.core.device import resolve_device
    from ecotrain.core.distributed import under_torchrun
    from ecotrain.memory.estimate import format_plan, make_plan
    from ecotrain.memory.measure import run_search
    from ecotrain.memory.planner import format_search
    from ecotrain.memory.shard import one_machine, strategies_for
    from ecotrain.report.memory_page import write_page

    world = int(os.environ["WORLD_SIZE"]) if under_torchrun() else 1
    if world > 1 and os.environ["RANK"] != "0":
        return 0
    budget = [f"memory.budget={args.budget}"] if args.budget else []
    cfg = load_config(args.recipe, [*args.overrides, *budget])
    if args.out and cfg.memory.budget is None:
        raise ConfigError("plan --out: needs --budget (the page shows the plans measured for it)")
    plan, blocks = make_plan(cfg)
    print(format_plan(cfg, plan, blocks))
    if args.measure or (args.measure is None and resolve_device(cfg.device).type == "cuda"):
        _plan_measured(cfg, plan, world)
    if cfg.memory.budget is None:
        return 0
    if world > 1:
        one_machine(world)
    with threads.for_fit(cfg.threads, cfg.data.workers):  # the thread count fit would train with
        search = run_search(cfg, ranks=world, strategies=strategies_for(cfg, world))
    batch = cfg.data.batch_size * cfg.loop.accumulate
    print(format_search(search, batch))
    if args.out:
        print(f"page: {write_page(search.record(batch), args.out, cfg.name)}")
    return 0 if search.chosen else 1


def _plan_measured(cfg, plan, ranks: int) -> None:
    """`plan`'s measured lines: the config as written, trained a few steps in a fresh process (one per rank)."""
    from ecotrain.base.errors import EXIT_USAGE, ConfigError, EcotrainError
    from ecotrain.core import threads
    from ecotrain.memory.estimate import measured_report
    from ecotrain.memory.measure import measure_config

    with threads.for_fit(cfg.threads, cfg.data.workers):  # the thread count fit would train with
        r = measure_config(cfg, ranks)
    lines, failed = measured_report(plan, r.out, r.device, cfg.memory.search_steps, r.error)
    if lines:
        print("\n".join(lines))
    if failed:
        raise (ConfigError if r.returncode == EXIT_USAGE else EcotrainError)(failed)
