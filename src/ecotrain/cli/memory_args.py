"""`ecotrain plan RECIPE`'s arguments (docs/memory.md). Argparse only, no torch: imported to parse the
command, before torch (ecotrain/cli/commands.py lists the commands). The body, the estimate and the measured
search (estimate.py, measure.py, planner.py), runs from cli.models.cmd_plan."""

from __future__ import annotations


def plan(pl) -> None:
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
