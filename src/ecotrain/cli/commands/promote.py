"""`ecotrain promote VERSION`: make a version current (continual/registry.py; docs/updates.md)."""

from __future__ import annotations

from ecotrain.cli.shared import REGISTRY_HELP

NAME = "promote"
HELP = "make a version current (also one the gate rejected)"
TRAINS = False


def arguments(p) -> None:
    p.add_argument("version")
    p.add_argument("--registry", default="registry", help=REGISTRY_HELP)


def run(args, ctx) -> int:
    from ecotrain.continual.registry import promote
    from ecotrain.continual.registry_mlflow import open_registry

    print(promote(open_registry(args.registry), args.version))
    return 0
