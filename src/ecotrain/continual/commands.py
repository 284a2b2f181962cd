"""CLI commands of continual updates: update, versions, promote, rollback, review-queue (docs/updates.md).
Heavy imports stay inside the handlers."""

from __future__ import annotations

import json

from ecotrain.errors import ConfigError

REGISTRY_HELP = "the registry: a folder (default ./registry), or mlflow:TRACKING_URI[#MODEL] (MLflow's Model Registry)"


def add_commands(sub) -> dict:
    u = sub.add_parser("update", help="train a new version from BASE on NEW_DATA, gate it, promote or reject it")
    u.add_argument("base", metavar="BASE_VERSION", help="a version name (v0002) or `current`")
    u.add_argument("data", metavar="NEW_DATA", help=".npz: x, y [, x_test, y_test, cohort, cohort_test]")
    u.add_argument("overrides", nargs="*", help="dotted overrides of the base's config, e.g. "
                   "'methods=[{name: replay}]' loop.max_steps=200")
    u.add_argument("--registry", default="registry", help=REGISTRY_HELP)
    u.add_argument("--recipe", help="train with this recipe instead of the base version's config")
    u.add_argument("--tolerance", type=float, default=0.02, help="largest allowed drop of the holdout's average "
                   "accuracy (default 0.02)")
    u.add_argument("--min-gain", type=float, default=0.0, help="the recent slice must improve by more (default 0)")
    u.add_argument("--cap", type=float, help="kappa: largest drop allowed on any one holdout slice on its own "
                   "(default: none, the average's --tolerance only)")
    u.add_argument("--average", metavar="ALPHAS", help="weight averaging: the trained model averaged with the base, "
                   "alpha * new + (1 - alpha) * base, the largest of these comma-separated alphas the gate accepts "
                   "(e.g. 1,0.75,0.5,0.25)")
    u.add_argument("--cohort", help="train this cohort's own version (e.g. adapters): served to requests of the "
                   "cohort and to those the router sends it; gated as predict serves it")
    u.add_argument("--label-map", help="JSON/YAML file mapping raw labels (strings, aliases) to class ids")
    u.add_argument("--contradiction-threshold", type=float, default=0.9, help="flag labels the base model "
                   "contradicts with at least this confidence (default 0.9)")
    u.add_argument("--drop-contradicted", action="store_true", help="leave flagged labels out of training")
    u.add_argument("--slice", dest="slice_name", help="name of the recent slice (default NEW_DATA's file stem)")
    u.add_argument("--drift-label-shift", type=float, default=0.3, help="alert threshold, total variation")
    u.add_argument("--drift-confidence-shift", type=float, default=0.15, help="alert threshold")
    u.add_argument("--drift-ece", type=float, default=0.15, help="alert threshold")
    u.add_argument("--drift-cohort-error", type=float, default=0.5, help="alert threshold, per cohort")
    u.add_argument("--progress", action="store_true", help="show the training progress")
    v = sub.add_parser("versions", help="list the registry's versions; `versions add RUN` registers a finished run; "
                       "`versions show V` prints a version's metrics")
    v.add_argument("action", nargs="?", choices=["list", "add", "show"], default="list")
    v.add_argument("target", nargs="?", metavar="RUN|VERSION")
    v.add_argument("--registry", default="registry", help=REGISTRY_HELP)
    v.add_argument("--data", help="add: the .npz whose test split (or whole) is the version's evaluation slice "
                   "(default: the run's test split)")
    v.add_argument("--slice", dest="slice_name", help="add: the slice's name (default the file stem, or `base`)")
    p = sub.add_parser("promote", help="make a version current (also one the gate rejected)")
    p.add_argument("version")
    p.add_argument("--registry", default="registry", help=REGISTRY_HELP)
    r = sub.add_parser("rollback", help="make the previously current version current again")
    r.add_argument("--registry", default="registry", help=REGISTRY_HELP)
    r.add_argument("--cohort", help="roll back this cohort's version instead (to its previous one, or the base)")
    q = sub.add_parser("review-queue", help="the lowest-confidence and most-contradicted examples, for review")
    q.add_argument("target", metavar="VERSION_OR_RUN", help="a version name, `current`, or a run/checkpoint folder")
    q.add_argument("data", metavar="DATA", help=".npz: x (and y for contradictions)")
    q.add_argument("--out", required=True, help="review.csv or review.json")
    q.add_argument("--top", type=int, default=50, help="how many of each kind (default 50)")
    q.add_argument("--registry", default="registry", help=REGISTRY_HELP)
    q.add_argument("--label-map", help="as for update")
    return {"update": cmd_update, "versions": cmd_versions, "promote": cmd_promote, "rollback": cmd_rollback,
            "review-queue": cmd_review_queue}


def _fraction(value: float, flag: str) -> float:
    if not 0 <= value <= 1:
        raise ConfigError(f"{flag} {value}: must be between 0 and 1")
    return value


def cmd_update(args) -> int:
    from ecotrain import cli
    from ecotrain.continual.drift import DriftThresholds
    from ecotrain.continual.gate import GatePolicy
    from ecotrain.continual.update import UpdateOptions, update

    if args.cap is not None:
        _fraction(args.cap, "--cap")
    average = ()
    if args.average:
        try:
            average = tuple(_fraction(float(a), "--average") for a in args.average.split(","))
        except ValueError:
            raise ConfigError(f"--average {args.average}: give alphas in [0, 1], comma-separated (1,0.5,0.25)") from None
    for flag in ("tolerance", "min_gain", "contradiction_threshold", "drift_label_shift", "drift_confidence_shift",
                 "drift_ece", "drift_cohort_error"):
        _fraction(getattr(args, flag), "--" + flag.replace("_", "-"))
    opts = UpdateOptions(GatePolicy(args.tolerance, args.min_gain, args.cap),
                         DriftThresholds(args.drift_label_shift, args.drift_confidence_shift, args.drift_ece,
                                         args.drift_cohort_error),
                         args.label_map, args.contradiction_threshold, args.drop_contradicted, args.slice_name,
                         args.recipe, quiet=not args.progress, cohort=args.cohort,
                         average=average)
    out = update(args.registry, args.base, args.data, args.overrides, opts, cli._PREEMPTION)
    m = out.meta["metrics"]
    print(" ".join(f"{t}={a:.4f}" for t, a in m["tasks"].items()))
    avg_f = m.get("average_forgetting")
    print(f"average_accuracy={m['average_accuracy']:.4f}" + (f" average_forgetting={avg_f:.4f}" if avg_f is not None
                                                              else ""))
    print(f"{out.version}: {out.reason}")
    return 0 if out.promoted else 1


def cmd_versions(args) -> int:
    from ecotrain.continual.registry import format_table
    from ecotrain.continual.registry_mlflow import open_registry

    reg = open_registry(args.registry)
    if args.action == "add":
        if not args.target:
            raise ConfigError("versions add: give the run folder, e.g. `ecotrain versions add runs/base`")
        from ecotrain.continual.update import register_run

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


def cmd_promote(args) -> int:
    from ecotrain.continual.registry import promote
    from ecotrain.continual.registry_mlflow import open_registry

    print(promote(open_registry(args.registry), args.version))
    return 0


def cmd_rollback(args) -> int:
    from ecotrain.continual.registry import rollback
    from ecotrain.continual.registry_mlflow import open_registry

    print(rollback(open_registry(args.registry), args.cohort))
    return 0


def cmd_review_queue(args) -> int:
    from pathlib import Path

    from ecotrain.continual.review import review_queue

    if Path(args.out).is_dir():  # else the finished queue would fail to replace it, after all the work
        raise ConfigError(f"--out {args.out}: is a folder; give a .csv or .json file")
    n, path = review_queue(args.target, args.data, args.out, args.registry, args.top, args.label_map)
    print(f"wrote {n} examples to review to {path}")
    return 0
