"""`ecotrain update BASE NEW_DATA`: train a new version from BASE on NEW_DATA, gate it, promote or reject it
(assembly/update.py; docs/updates.md)."""

from __future__ import annotations

from ecotrain.cli.shared import REGISTRY_HELP

NAME = "update"
HELP = "train a new version from BASE on NEW_DATA, gate it, promote or reject it"
TRAINS = True


def arguments(u) -> None:
    u.add_argument("base", metavar="BASE_VERSION", help="a version name (v0002), `current`, or a finished run folder "
                   "(registered first when the registry is empty)")
    u.add_argument("data", metavar="NEW_DATA", help=".npz: x, y [, x_test, y_test, cohort, cohort_test]; a language "
                   "model's: tokens:DIR, tokens:FILE.bin, shards:PATTERN or text")
    u.add_argument("overrides", nargs="*", help="dotted overrides of the base's config, e.g. "
                   "'methods=[{name: replay}]' loop.max_steps=200")
    u.add_argument("--registry", default="registry", help=REGISTRY_HELP)
    u.add_argument("--recipe", help="train with this recipe instead of the base version's config")
    u.add_argument("--tolerance", type=float, default=0.02, help="largest allowed drop of the holdout's average "
                   "accuracy (default 0.02); a language model's: largest relative rise of its perplexity (0.02: 2%%)")
    u.add_argument("--min-gain", type=float, default=0.0, help="the recent slice must improve by more (default 0; "
                   "a language model's perplexity: relative fall)")
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
    u.add_argument("--hold", action="store_true", help="a version that passes the gate stays a candidate for "
                   "`ecotrain canary` to promote (or `ecotrain promote`), instead of becoming current")
    u.add_argument("--progress", action="store_true", help="show the training progress")


def _fraction(value: float, flag: str) -> float:
    from ecotrain.base.errors import ConfigError

    if not 0 <= value <= 1:
        raise ConfigError(f"{flag} {value}: must be between 0 and 1")
    return value


def run(args, ctx) -> int:
    """Trains under `ctx.preemption` (the stop-signal handler)."""
    from ecotrain.base.errors import ConfigError

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
    from ecotrain.assembly.update import UpdateOptions, update
    from ecotrain.continual.drift import DriftThresholds
    from ecotrain.continual.gate import GatePolicy

    opts = UpdateOptions(GatePolicy(args.tolerance, args.min_gain, args.cap),
                         DriftThresholds(args.drift_label_shift, args.drift_confidence_shift, args.drift_ece,
                                         args.drift_cohort_error),
                         args.label_map, args.contradiction_threshold, args.drop_contradicted, args.slice_name,
                         args.recipe, quiet=not args.progress, cohort=args.cohort,
                         average=average, hold=args.hold)
    out = update(args.registry, args.base, args.data, args.overrides, opts, ctx.preemption)
    m = out.meta["metrics"]
    if out.meta.get("task") == "language_model":  # perplexities, lower is better (assembly/update_lm.py)
        before = m["base"]["tasks"]
        for t, p in m["tasks"].items():
            print(f"{t}: perplexity {before[t]:.4f} -> {p:.4f}")
        ratio = m.get("forgetting_ppl_ratio")
        print(f"average_perplexity={m['average_perplexity']:.6g} new_ppl_ratio={m['new_ppl_ratio']:.6g}"
              + (f" forgetting_ppl_ratio={ratio:.6g}" if ratio is not None else ""))  # 4.5e-05, not 0.0000
        print(f"{out.version}: {out.reason}")
        return 0 if out.promoted or out.held else 1
    print(" ".join(f"{t}={a:.4f}" for t, a in m["tasks"].items()))
    avg_f = m.get("average_forgetting")
    print(f"average_accuracy={m['average_accuracy']:.4f}" + (f" average_forgetting={avg_f:.4f}" if avg_f is not None
                                                              else ""))
    print(f"{out.version}: {out.reason}")
    return 0 if out.promoted or out.held else 1  # held: the gate passed; the canary decides
