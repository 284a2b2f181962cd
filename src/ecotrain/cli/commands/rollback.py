"""`ecotrain rollback`: make the previously current version current again (continual/registry.py)."""

from __future__ import annotations

from ecotrain.cli.shared import REGISTRY_HELP

NAME = "rollback"
HELP = "make the previously current version current again"
TRAINS = False


def arguments(r) -> None:
    r.add_argument("--registry", default="registry", help=REGISTRY_HELP)
    r.add_argument("--cohort", help="roll back this cohort's version instead (to its previous one, or the base)")


def run(args, ctx) -> int:
    from ecotrain.continual.registry import rollback
    from ecotrain.continual.registry_mlflow import open_registry

    print(rollback(open_registry(args.registry), args.cohort))
    return 0
