"""The bodies of continual updates' commands: update, versions, promote, rollback, canary, review-queue
(docs/updates.md). cli/continual_args.py parses their arguments; cli/program.py imports this module when one
of them runs. Each handler takes `(args, ctx)`: `ctx` is the CLI's CommandContext, whose
`preemption` (the stop-signal handler) `update` trains under."""

from __future__ import annotations

import json
from pathlib import Path

from ecotrain.continual.drift import DriftThresholds
from ecotrain.continual.gate import GatePolicy
from ecotrain.continual.registry import format_table, promote, rollback
from ecotrain.continual.registry_mlflow import open_registry
from ecotrain.continual.review import review_queue
from ecotrain.assembly.update import UpdateOptions, register_run, update
from ecotrain.base.errors import ConfigError


def _fraction(value: float, flag: str) -> float:
    if not 0 <= value <= 1:
        raise ConfigError(f"{flag} {value}: must be between 0 and 1")
    return value


def cmd_update(args, ctx) -> int:
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
                         average=average, hold=args.hold)
    out = update(args.registry, args.base, args.data, args.overrides, opts, ctx.preemption)
    m = out.meta["metrics"]
    if out.meta.get("task") == "language_model":  # perplexities, lower is better (assembly/update_lm.py)
        before = m["base"]["tasks"]
        for t, p in m["tasks"].items():
            print(f"{t}: perplexity {before[t]:.4f} -> {p:.4f}")
        ratio = m.get("forgetting_ppl_ratio")
        print(f"average_perplexity={m['average_perplexity']:.4f} new_ppl_ratio={m['new_ppl_ratio']:.4f}"
              + (f" forgetting_ppl_ratio={ratio:.4f}" if ratio is not None else ""))
        print(f"{out.version}: {out.reason}")
        return 0 if out.promoted or out.held else 1
    print(" ".join(f"{t}={a:.4f}" for t, a in m["tasks"].items()))
    avg_f = m.get("average_forgetting")
    print(f"average_accuracy={m['average_accuracy']:.4f}" + (f" average_forgetting={avg_f:.4f}" if avg_f is not None
                                                              else ""))
    print(f"{out.version}: {out.reason}")
    return 0 if out.promoted or out.held else 1  # held: the gate passed; the canary decides


def cmd_canary(args, ctx) -> int:
    from ecotrain.continual.canary import CanaryRule, exit_code, run_canary

    rule = CanaryRule(args.max_drop, args.max_latency_ratio, args.mode, args.share, args.seed)
    decision, line, fig = run_canary(args.registry, args.version, args.requests, rule, args.cohort, args.out)
    print(f"canary_drop={fig['drop']:+.4f} [{fig['drop_interval'][0]:+.4f}, {fig['drop_interval'][1]:+.4f}] "
          f"latency_ratio={fig['latency_ratio']:.3f} [{fig['latency_ratio_interval'][0]:.3f}, "
          f"{fig['latency_ratio_interval'][1]:.3f}] decision={decision}")
    print(line)
    return exit_code(decision)


def cmd_versions(args, ctx) -> int:
    reg = open_registry(args.registry)
    if args.action == "add":
        if not args.target:
            raise ConfigError("versions add: give the run folder, e.g. `ecotrain versions add runs/base`")
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


def cmd_promote(args, ctx) -> int:
    print(promote(open_registry(args.registry), args.version))
    return 0


def cmd_rollback(args, ctx) -> int:
    print(rollback(open_registry(args.registry), args.cohort))
    return 0


def cmd_review_queue(args, ctx) -> int:
    if Path(args.out).is_dir():  # else the finished queue would fail to replace it, after all the work
        raise ConfigError(f"--out {args.out}: is a folder; give a .csv or .json file")
    n, path = review_queue(args.target, args.data, args.out, args.registry, args.top, args.label_map)
    print(f"wrote {n} examples to review to {path}")
    return 0
