"""`ecotrain bn-report RUN`: a run's BatchNorm report (methods/batchnorm.py)."""

from __future__ import annotations

NAME = "bn-report"
HELP = "print a run's BatchNorm report (methods: [{name: batchnorm}])"
TRAINS = False


def arguments(bn) -> None:
    bn.add_argument("run_dir")


def run(args, ctx) -> int:
    from ecotrain.methods.batchnorm import format_report, read_report

    print(format_report(read_report(args.run_dir)))
    return 0
