"""`ecotrain versions [list|add RUN|show V]`: the registry's versions (continual/registry.py; docs/updates.md)."""

from __future__ import annotations

from ecotrain.cli.shared import REGISTRY_HELP

NAME = "versions"
HELP = ("list the registry's versions; `versions add RUN` registers a finished run; `versions show "
        "V` prints a version's metrics")
TRAINS = False


def arguments(v) -> None:
    v.add_argument("action", nargs="?", choices=["list", "add", "show"], default="list")
    v.add_argument("target", nargs="?", metavar="RUN|VERSION")
    v.add_argument("--registry", default="registry", help=REGISTRY_HELP)
    v.add_argument("--data", help="add: the .npz whose test split (or whole) is the version's evaluation slice "
                   "(default: the run's test split)")
    v.add_argument("--slice", dest="slice_name", help="add: the slice's name (default the file stem, or `base`)")


def run(args, ctx) -> int:
    import json

    from ecotrain.base.errors import ConfigError
    from ecotrain.continual.registry import format_table
    from ecotrain.continual.registry_mlflow import open_registry

    reg = open_registry(args.registry)
    if args.action == "add":
        if not args.target:
            raise ConfigError("versions add: give the run folder, e.g. `ecotrain versions add runs/base`")
        from ecotrain.assembly.update import register_run

        out = register_run(args.registry, args.target, args.slice_name, args.data)
        print(f"{out.version}: {out.reason}" + (" (current)" if out.promoted else ""))
        return 0
    if args.action == "show":
        name = reg.resolve(args.target or "current")
        meta = reg.read_meta(name)
        shown = {k: meta.get(k) for k in ("parent", "created", "weights", "classes_seen", "data", "slices",
                                          "metrics", "drift", "labels")}
        print(json.dumps({"version": name, **reg.index()["versions"][name], **shown}, indent=2))
        return 0
    print(format_table(reg.existing_index()))  # a mistyped --registry is an error, not an empty list
    return 0
