"""`ecotrain lr-find RECIPE`: the LR range test, a plot and a suggested peak LR; writes no run folder
(assembly/lrfind.py runs it)."""

from __future__ import annotations

NAME = "lr-find"
HELP = "LR range test: a plot and a suggested peak LR (writes no run folder)"
TRAINS = False


def arguments(lr) -> None:
    lr.add_argument("recipe")
    lr.add_argument("overrides", nargs="*", help="dotted overrides, e.g. data.batch_size=200")
    lr.add_argument("--steps", type=int, default=200, help="optimizer steps of the sweep (default 200)")
    lr.add_argument("--start", type=float, default=1e-5, help="first LR (default 1e-5)")
    lr.add_argument("--end", type=float, default=1.0, help="last LR (default 1)")
    lr.add_argument("--smooth", type=float, default=0.9, help="EMA factor of the smoothed loss (default 0.9)")
    lr.add_argument("--diverge", type=float, default=4.0, help="stop once the smoothed loss exceeds this "
                    "times its minimum (default 4)")
    lr.add_argument("--out", help="plot path (default runs/<name>-lrfind.png; the curve beside it as .json)")


def run(args, ctx) -> int:
    from ecotrain.assembly.lrfind import cmd_lr_find  # imports torch: here, never for --help

    return cmd_lr_find(args, ctx)
