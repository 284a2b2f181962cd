"""`ecotrain review-queue VERSION_OR_RUN DATA --out FILE`: the lowest-confidence and most-contradicted
examples, for review (continual/review.py; docs/updates.md)."""

from __future__ import annotations

from ecotrain.cli.shared import REGISTRY_HELP

NAME = "review-queue"
HELP = "the lowest-confidence and most-contradicted examples, for review"
TRAINS = False


def arguments(q) -> None:
    q.add_argument("target", metavar="VERSION_OR_RUN", help="a version name, `current`, or a run/checkpoint folder")
    q.add_argument("data", metavar="DATA", help=".npz: x (and y for contradictions)")
    q.add_argument("--out", required=True, help="review.csv or review.json")
    q.add_argument("--top", type=int, default=50, help="how many of each kind (default 50)")
    q.add_argument("--registry", default="registry", help=REGISTRY_HELP)
    q.add_argument("--label-map", help="as for update")


def run(args, ctx) -> int:
    from pathlib import Path

    from ecotrain.base.errors import ConfigError
    from ecotrain.continual.review import review_queue

    if Path(args.out).is_dir():  # else the finished queue would fail to replace it, after all the work
        raise ConfigError(f"--out {args.out}: is a folder; give a .csv or .json file")
    n, path = review_queue(args.target, args.data, args.out, args.registry, args.top, args.label_map)
    print(f"wrote {n} examples to review to {path}")
    return 0
