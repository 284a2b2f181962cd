"""`ecotrain resume RUN [overrides]`: continue a run from its newest valid checkpoint (assembly/entry.py)."""

from __future__ import annotations

NAME = "resume"
HELP = "continue a run from its newest valid checkpoint"
TRAINS = True


def arguments(r) -> None:
    r.add_argument("run_dir")
    r.add_argument("overrides", nargs="*", help="dotted overrides (need --allow-config-change)")
    r.add_argument("--quiet", action="store_true")
    r.add_argument("--allow-config-change", action="store_true")


def run(args, ctx) -> int:
    from ecotrain.assembly.entry import resume_run  # imports torch: here, never for --help

    return ctx.trained(resume_run(args.run_dir, args.overrides, quiet=args.quiet,
                                  allow_config_change=args.allow_config_change, preemption=ctx.preemption))
